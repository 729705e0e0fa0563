"""The verl backend: the paper's recipe on many machines (Ray, FSDP, vLLM rollouts), same rewards and
exactly the same c-GDPO advantages as the TRL backend. Its commands (``balcaprl verl export|launch``)
are in :mod:`balcaprl.cli.verl`.

    export.py     dataset folder -> verl multimodal parquet rows       (``balcaprl verl export``)
    reward.py     async ``compute_score``: judge, length mask, NaN for failed judges; the rollout's record
    estimator.py  verl estimators ``balcaprl_c_gdpo`` / ``balcaprl_grpo`` = ``balcaprl.c_gdpo_advantages``;
                  a V1 batch's records -> the batch step (``balcaprl.train.step``)
    trainer.py    verl V1 trainer mode ``balcaprl_sync``: runs the batch step, hands its advantages on
    plugin.py     imported by every verl process (``VERL_USE_EXTERNAL_MODULES``): registers the above
    render.py     recipe -> verl Hydra overrides; rejects what verl cannot do
    launch.py     writes the run folder's files and starts ``main.py`` (``balcaprl verl launch``)
    main.py       ``python -m balcaprl.train.verl_backend.main``: verl's ``main_ppo`` with balcaprl registered

Only export.py, reward.py, estimator.py and render.py import without verl; the rest needs
``pip install 'balcaprl[verl]'``. Nothing is imported here, so ``import balcaprl.train`` stays cheap.
"""
