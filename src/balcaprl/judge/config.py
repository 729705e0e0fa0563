"""The judge configuration: what `--judge CONFIG` and a recipe's `judge:` section hold.

Unknown keys are an error (a typo must not silently fall back to a default that costs money). The
API key itself never sits in a config: only the *name* of the environment variable that holds it.
Loaded with the common machinery (:func:`balcaprl.config.load_config`): one error type, the same
messages and ``base:`` chains as every other config.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BeforeValidator, ConfigDict, Field, field_validator, model_validator

from balcaprl.config import Override, Section, load_config, read_config_file
from balcaprl.errors import ConfigError
from balcaprl.judge.rubrics import ReferenceMode
from balcaprl.judge.tokens import CompletionBudget

# Each call in flight holds one connection (a file descriptor) and up to one answer's bytes
# (calls.answer_byte_limit: 320 KiB at max_tokens 4096, so 1.3 GiB here at most). 4096 is 16x the
# default and twice a paper-sized step (2,048 calls) all in flight; beyond it a typo such as
# 100000000 would only exhaust sockets and memory, so it is refused when the config loads.
MAX_CONCURRENCY = 4096

# A judge configuration that cannot work (bad file, bad key, missing API key, rejected by the server):
# the one config error, under the name the judge client raises it by.
JudgeConfigError = ConfigError


class PriceTable(Section):
    """USD per one million tokens, for the cost estimate in the accounting (not billing-exact)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: float = Field(ge=0, description="USD per 1M prompt (input) tokens.")
    completion: float = Field(ge=0, description="USD per 1M completion (output) tokens.")


class RubricOptions(Section):
    """Where the judge's prompts deliberately differ from the paper's, each difference by name.

    Every rule of the paper's prompts and the project's wording of it are compared in
    ``docs/rubrics.md``; a difference that would change a judge's decisions is an option here, off
    by default wherever the paper is explicit.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    reference_image: bool = Field(
        False,
        description="cached-reference mode only (the paper has no such mode): send the image with the "
        "reference decomposition. Splitting a text needs no picture, so by default it is text only (and "
        "one decomposition serves every image with the same reference); turn it on for judges that "
        "decompose against the picture, such as the synthetic oracle, which keeps a reference's true "
        "scene facts.",
    )


class JudgeConfig(Section):
    """Settings of the OpenAI-compatible judge client. Defaults reproduce the paper's set-up."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(
        "https://api.openai.com/v1",
        description="Any OpenAI-compatible endpoint (OpenAI, vLLM, SGLang, loopback).",
    )
    model: str = Field("gpt-4o-mini", min_length=1, description="Model name the endpoint serves.")
    api_key_env: str | None = Field(
        "OPENAI_API_KEY",
        description="Name of the environment variable holding the API key; null for servers without auth.",
    )
    reference_mode: ReferenceMode = Field(
        "joint",
        description="joint: one call decomposes caption and reference (the paper). cached-reference: the "
        "reference is decomposed once per (image, reference) and each rollout only marks coverage.",
    )
    rubric: RubricOptions = Field(
        default_factory=RubricOptions,
        description="Deliberate differences from the paper's judge prompts (docs/rubrics.md).",
    )
    concurrency: int | Literal["auto"] = Field(
        "auto",
        description="Judge calls in flight at once (for the whole run: a training launch on N processes gives "
        f"each 1/N of this and of the rate caps), at most {MAX_CONCURRENCY}; or auto: as many as the rate "
        "limits (stated, or a default tier's) feed at the observed latency, up to auto_max_concurrency and "
        "the process's open-file limit (judge/throughput.py).",
    )
    auto_max_concurrency: int = Field(
        2048,
        ge=1,
        le=MAX_CONCURRENCY,
        description="concurrency: auto puts at most this many calls in flight (a paper step's 2,048 rollouts "
        "all at once), fewer where the open-file limit leaves fewer sockets.",
    )
    horizon_s: float = Field(
        3600.0,
        gt=0,
        description="A command whose calls the rate limits alone make take longer than this says so, with "
        "the predicted time, before its first call.",
    )
    timeout_s: float = Field(
        60.0,
        gt=0,
        description="Time limit of one attempt (sending, waiting, reading the answer), in seconds.",
    )
    max_retries: int = Field(
        4, ge=0, description="Retries on timeouts, dropped connections, 408/409/429 and 5xx."
    )
    temperature: float | None = Field(0.0, ge=0, description="Sampling temperature; null omits it.")
    max_tokens: int = Field(4096, ge=16, description="Most completion tokens per call.")
    requests_per_minute: int | None = Field(
        None, ge=1, description="Client-side request rate cap (for the whole run); null = none."
    )
    tokens_per_minute: int | None = Field(
        None, ge=1, description="Client-side token rate cap (for the whole run); null = none."
    )
    max_image_side: int = Field(
        1024, ge=16, description="Longest image side sent; larger images are downscaled."
    )
    caption_char_cap: int = Field(
        4000, ge=1, description="Captions longer than this are cut (truncated_input)."
    )
    cache_path: Path | None = Field(
        Path("~/.cache/balcaprl/judge.sqlite"),
        validate_default=True,  # so the default's ~ is expanded too
        description="SQLite verdict cache; null disables it.",
    )
    price_per_million_tokens: PriceTable | None = Field(
        None, description="USD per 1M prompt/completion tokens, for cost estimates; null = no estimate."
    )

    # -- the judge in training (issue 24, judge-speed) --
    cache_rollouts: bool = Field(
        False,
        description="Use the verdict cache for RL rollouts too. Off by default: sampled rollouts almost never "
        "repeat, so a training run would pay a cache write per call for no hits (and a cache on a shared "
        "filesystem is unsafe for SQLite across hosts). Evaluation and re-scoring always use the cache.",
    )

    # -- tail control (issue 24, judge-speed; judge/tail.py) --
    stream: bool = Field(
        True,
        description="Ask for a streamed answer (stream: true, usage in its last chunk), so the time to the first "
        "byte is the time to the first token: what tells a stalled call from a long one. A server that answers "
        "a streamed request whole is seen to, and asked unstreamed from then on.",
    )
    first_byte_timeout_s: float | None = Field(
        30.0,
        gt=0,
        description="Time limit to an attempt's first token, once the endpoint is seen to stream (unstreamed, "
        "the first byte comes with the whole answer: timeout_s alone holds); null = no limit of its own. "
        "30 s: a hosted judge's p99 for a whole call; a first token later than that is a stall.",
    )
    chunk_gap_timeout_s: float | None = Field(
        30.0,
        gt=0,
        description="Longest silence between two chunks of an answer being read; null = no limit. As long as a "
        "first token: a healthy stream pauses only when its server re-computes a preempted sequence.",
    )
    hedge: bool = Field(
        True,
        description="An attempt with no first byte after hedge_quantile of the observed times to first byte "
        "(at least hedge_floor_s) gets one duplicate; the first answer wins, the other is cancelled. When one "
        "copy fails while the other has produced nothing, the one left is watched alike, once.",
    )
    hedge_quantile: float = Field(
        0.98,
        gt=0,
        lt=1,
        description="See hedge; well above 1 - hedge_max_share, so the cap is kept for the tail.",
    )
    hedge_floor_s: float = Field(5.0, gt=0, description="The shortest wait before a duplicate (see hedge).")
    hedge_max_share: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Duplicates at most this share of the calls of any batch and of any 1,000 consecutive "
        "calls (counted in the cost).",
    )

    @property
    def concurrency_auto(self) -> bool:
        return self.concurrency == "auto"

    @field_validator("concurrency")
    @classmethod
    def _in_flight(cls, value: int | str) -> int | str:
        if value != "auto" and not 1 <= value <= MAX_CONCURRENCY:
            raise ValueError(f"must be auto or a number of calls in flight from 1 to {MAX_CONCURRENCY}")
        return value

    @model_validator(mode="after")
    def _one_call_fits(self) -> JudgeConfig:
        # The token limiter reserves this much for a call's answer before any answer is seen
        # (tokens.CompletionBudget): a budget below it would admit one call a minute at best.
        reserve = min(self.max_tokens, CompletionBudget().first_guess)
        if self.tokens_per_minute is not None and self.tokens_per_minute < reserve:
            raise ValueError(
                f"tokens_per_minute {self.tokens_per_minute:,} is less than one call's answer budget "
                f"({reserve:,} tokens): raise it to your tier's limit, or set it to null"
            )
        return self

    @field_validator("cache_path")
    @classmethod
    def _expand_user(cls, value: Path | None) -> Path | None:
        return None if value is None else Path(os.path.expanduser(str(value)))

    @field_validator("base_url")
    @classmethod
    def _no_password(cls, value: str) -> str:
        # secrets come only from the environment: a password in the URL would be copied into every
        # recipe.yaml, eval.json and log line that names the endpoint
        if urlsplit(value).password is not None:
            raise ValueError(
                "holds a password (user:***@host); balcaprl reads secrets only from environment variables: "
                "remove it from the URL and put the key in the variable named by api_key_env"
            )
        return value

    def resolve_api_key(self) -> str:
        """The API key from the environment. Raises :class:`JudgeConfigError` if it is not set.

        Servers without auth (a local vLLM started without ``--api-key``) accept any key: set
        ``api_key_env: null`` and a placeholder is sent.
        """
        if self.api_key_env is None:
            return "EMPTY"
        key = os.environ.get(self.api_key_env)
        if not key:
            raise JudgeConfigError(
                f"the judge's API key variable {self.api_key_env} is not set: export it "
                f"(export {self.api_key_env}=...), or set `api_key_env: null` for a server without auth"
            )
        return key

    def shared_by(self, processes: int) -> JudgeConfig:
        """This config for one of ``processes`` clients sharing one endpoint (a training launch builds one
        judge per GPU process): concurrency and rate caps divided among them, at least 1 each."""
        if processes <= 1:
            return self

        def share(limit: int | None) -> int | None:
            return None if limit is None else max(1, limit // processes)

        return self.model_copy(
            update={
                "concurrency": "auto" if self.concurrency_auto else share(self.concurrency),
                "auto_max_concurrency": share(self.auto_max_concurrency),
                "requests_per_minute": share(self.requests_per_minute),
                "tokens_per_minute": share(self.tokens_per_minute),
            }
        )


def _judge_file(value: Any) -> Any:
    # A path: that YAML's keys (and its base: chain), validated as the section that names it, so
    # errors read <section>.judge.<key>. A config file resolves its relative paths before this.
    return read_config_file(value, "judge config") if isinstance(value, str | Path) else value


# A judge section of another config (a recipe, an evaluation config): a JudgeConfig written inline or
# the path of a judge YAML, validated when that config loads.
JudgeSection = Annotated[JudgeConfig, BeforeValidator(_judge_file)]


def load_judge_config(
    source: Path | str | Mapping[str, Any], overrides: Iterable[Override] = ()
) -> JudgeConfig:
    """A validated :class:`JudgeConfig` from a YAML file (path) or an already-parsed mapping.

    Raises :class:`ConfigError` (``JudgeConfigError``) naming the file and every offending key.
    """
    if isinstance(source, Mapping):
        return load_config(
            JudgeConfig, data=source, overrides=overrides, source="mapping", what="judge config"
        )
    return load_config(JudgeConfig, Path(source), overrides, what="judge config")
