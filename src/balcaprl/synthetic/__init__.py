"""The synthetic captioning world: the offline ground on which the whole loop is real and checkable.

One module per job, in the order data flows:

- :mod:`~balcaprl.synthetic.lexicon` the closed vocabulary (captions, parser and tokenizer share it)
- :mod:`~balcaprl.synthetic.scenes` seeded scene graphs (2..7 shapes on a 3x3 grid)
- :mod:`~balcaprl.synthetic.render` Pillow renderer and the pixel keys that find a scene again
- :mod:`~balcaprl.synthetic.captions` good reference captions
- :mod:`~balcaprl.synthetic.flaws` flawed captions of controlled kinds
- :mod:`~balcaprl.synthetic.parser` caption -> atomic assertions decided against a scene
- :mod:`~balcaprl.synthetic.linguistic` clarity/fluency/coherency from measurable style facts
- :mod:`~balcaprl.synthetic.oracle` :class:`OracleJudge`, a :class:`balcaprl.judge.Judge`
- :mod:`~balcaprl.synthetic.build` ``balcaprl synthetic build`` (the pinned dataset format)
- :mod:`~balcaprl.synthetic.tokenizer`, :mod:`~balcaprl.synthetic.policy` the tiny LLaVA policy
- :mod:`~balcaprl.synthetic.sft` ``balcaprl synthetic sft``; :mod:`~balcaprl.synthetic.evaluation`
  held-out oracle b-CapScore

Heavy modules (transformers, torch models) are imported only where they are used.
"""
