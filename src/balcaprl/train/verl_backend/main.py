"""``python -m balcaprl.train.verl_backend.main [Hydra overrides]``: verl's ``main_ppo`` with balcaprl.

The same entry point as ``python -m verl.trainer.main_ppo`` (same Hydra config, same overrides), after
registering the balcaprl estimators and trainer in this driver process. Ray workers get them through
``VERL_USE_EXTERNAL_MODULES`` (see ``plugin.py``); ``balcaprl verl launch`` renders both.
"""

from __future__ import annotations

import balcaprl.train.verl_backend.plugin  # noqa: F401  (registers balcaprl with verl in the driver)


def main() -> None:
    from verl.trainer.main_ppo import main as verl_main

    verl_main()


if __name__ == "__main__":
    main()
