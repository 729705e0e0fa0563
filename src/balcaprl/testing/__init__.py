"""Test doubles: stand-ins for a real judge, kept apart from the code that trains and evaluates.

- :mod:`balcaprl.testing.judge_server`: a loopback OpenAI-compatible ``/v1/chat/completions`` server
  in front of any :class:`~balcaprl.judge.Judge` (the synthetic oracle, the scripted judge), with
  scripted faults (timeouts, 429/5xx, dropped connections, broken JSON) and latency. It needs the
  ``[serve]`` extra. ``balcaprl judge serve`` and the offline demo run it; tests and benchmarks too.
- :mod:`balcaprl.testing.scripted_judge`: a deterministic rule-based judge whose verdicts can be
  computed by hand.
- :mod:`balcaprl.testing.loop_advantages`: c-GDPO and GRPO as plain per-group loops, to check the
  vectorised ``balcaprl.advantages`` against (tests) and to measure it (benchmarks).
- :mod:`balcaprl.testing.compare_modes`: the joint vs cached-reference comparison on the scripted judge.
- :mod:`balcaprl.testing.sharegpt4v_fixture`: a generated stand-in for ShareGPT4V in its exact layout.
- :mod:`balcaprl.testing.toy_demo`: the smallest demo config that runs every stage.
- :mod:`balcaprl.testing.rubrics`: which packaged rubric a system message is (for the server: the
  prompts themselves carry nothing that names their rubric).

Nothing under ``balcaprl.train``, ``balcaprl.evaluate`` or ``balcaprl.judge`` imports this package.
"""
