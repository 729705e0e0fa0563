"""What a training run will need before it runs (``balcaprl train CONFIG --plan``): GPU memory and
disk (:mod:`balcaprl.plan.memory`), and the judge's calls, tokens, dollars and minutes
(:mod:`balcaprl.plan.judge_cost`). Arithmetic over the recipe and the model's config only: nothing here
loads weights, starts a process or calls the judge."""
