"""A word-level tokenizer for the synthetic world's closed vocabulary, built locally (no download).

One token per lexicon word or punctuation mark, lowercased; ChatML specials (``<|im_start|>``,
``<|im_end|>``) and LLaVA's ``<image>`` are added as special tokens so the chat template tokenizes
exactly. Decoding joins words with spaces and removes the space before ``.`` and ``,``
(a WordPiece decoder with clean-up), so decoded captions read "a red circle, at the top."; the parser
accepts either spacing. Because the tokenizer's pre-tokenization is :func:`lexicon.words_of`,
``len(words_of(text))`` is the policy's token count for any in-vocabulary text.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from balcaprl.synthetic.lexicon import all_words

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
IMAGE_TOKEN = "<image>"
UNK_TOKEN = "[UNK]"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, EOS_TOKEN, IMAGE_TOKEN, UNK_TOKEN)
TOKENIZER_NAME = "balcaprl-synthetic-wordlevel-v1"


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The tiny policy's tokenizer; deterministic (same vocabulary, same ids, every time)."""
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *all_words()])}
    core = Tokenizer(models.WordLevel(vocab, unk_token=UNK_TOKEN))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation("isolated")]
    )
    core.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token=UNK_TOKEN,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        additional_special_tokens=[IM_START, IMAGE_TOKEN],
        padding_side="left",  # generation pads on the left; training code pads explicitly
        name_or_path=TOKENIZER_NAME,
        model_max_length=1024,
    )
    return tokenizer
