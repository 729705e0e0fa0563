"""The closed vocabulary of the synthetic world: every word a scene, a caption (good or flawed), the
prompt and the chat template can use, and what each word means to the parser.

One table feeds three consumers so they cannot drift apart: the caption generators write only these
words, the oracle's parser understands exactly these words, and the tiny policy's word-level tokenizer
has exactly these words (so every caption flaw the oracle penalises is one the policy can produce).
"""

from __future__ import annotations

import re

# --- what a scene is made of -------------------------------------------------------------------------
KINDS = ("circle", "square", "triangle", "star", "diamond", "hexagon", "cross", "ring")
PLURALS = {kind: kind + ("es" if kind.endswith("s") else "s") for kind in KINDS}
COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "black")
SIZES = ("small", "medium", "large")
TEXTURES = ("plain", "striped", "dotted", "checkered")
# Short words printed on some medium/large shapes; none collides with another word's meaning.
TEXT_WORDS = ("go", "stop", "hi", "ok", "yes", "zip", "fun", "win")

# The 3x3 regions, (row, col) -> canonical name (used in assertion texts).
CELL_NAMES = {
    (0, 0): "top left",
    (0, 1): "top",
    (0, 2): "top right",
    (1, 0): "left",
    (1, 1): "center",
    (1, 2): "right",
    (2, 0): "bottom left",
    (2, 1): "bottom",
    (2, 2): "bottom right",
}

NUMBER_WORDS = {
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
}
_NUMBER_NAMES = {value: word for word, value in NUMBER_WORDS.items()}


def number_word(n: int) -> str:
    return _NUMBER_NAMES[n]


# --- what the parser recognises ----------------------------------------------------------------------
SIZE_WORDS = {"small": "small", "tiny": "small", "medium": "medium", "large": "large", "big": "large"}
GENERIC_SINGULAR = {"shape", "object", "figure"}
GENERIC_PLURAL = {"shapes", "objects", "figures"}
ROW_WORDS = {"top": 0, "upper": 0, "bottom": 2, "lower": 2}
COL_WORDS = {"left": 0, "right": 2}
CENTER_WORDS = {"center", "middle", "centre"}
POSITION_NOUNS = {"corner", "side", "edge", "area", "part", "half"}
POSITION_PREPOSITIONS = {"in", "at", "on", "near", "along", "toward", "towards"}
FRAME_NOUNS = {"image", "picture", "frame", "canvas", "scene"}
BACKGROUND_NOUNS = {"background", "backdrop"}
TEXT_VERBS = {"labelled", "labeled", "reads", "reading", "marked", "bearing", "carries", "carrying", "shows"}
DETERMINERS_INDEFINITE = {"a", "an", "another"}
DETERMINERS_DEFINITE = {"the"}
CLAUSE_BREAKS = {",", ";", ":", "and", "while", "whereas", "but", "which", "where", "then"}
SENTENCE_ENDS = {".", "!", "?"}
RELATION_WORDS = {"to", "the", "left", "right", "of", "above", "below", "beneath", "under"}
LIST_BULLETS = {"-", "*"}

# Meta-commentary: a clause with one of these words is an assertion nobody can point at.
META_TRIGGERS = {
    "composition", "feels", "feel", "evokes", "evoke", "sense", "harmony", "mood", "playful", "pleasing",
    "visually", "invites", "viewer", "depth", "contrast", "dance", "cheerful", "energy", "lively",
    "inviting", "calm", "balanced", "beautiful", "elegant", "striking", "atmosphere", "seem", "seems",
    "eye", "whimsical", "joyful", "rhythm",
}  # fmt: skip
META_SENTENCES = (
    "The composition feels balanced and calm.",
    "This arrangement evokes a sense of harmony.",
    "The bright colors create a playful mood.",
    "The layout is visually pleasing.",
    "It invites the viewer to look closer.",
    "The contrast adds depth to the scene.",
    "The shapes seem to dance across the canvas.",
    "Overall, the image has a cheerful energy.",
    "The scene feels lively and inviting.",
    "Together the shapes create a whimsical rhythm that draws the eye.",
)
# Evidence-based inferences: not pointable under the training rubric, but the evaluation rubric's
# "point to evidence that justifies it" test passes them (they are true of every image here).
INFERENCE_TRIGGERS = {"illustration", "drawing", "generated", "digital", "graphic", "diagram"}
INFERENCE_SENTENCES = (
    "The picture looks like a simple computer generated illustration.",
    "It appears to be a flat digital drawing.",
    "This is clearly a simple graphic rather than a photo.",
)

# Words that carry no assertion of their own (verbs, prepositions, connectives...).
FILLER_WORDS = {
    "a", "an", "the", "another", "is", "are", "sits", "sit", "rests", "rest", "lies", "lie", "appears",
    "appear", "can", "be", "seen", "there", "holds", "hold", "contains", "contain", "shows", "show",
    "features", "placed", "positioned", "located", "and", "with", "while", "which", "it", "its", "of",
    "this", "also", "finally", "next", "nearby", "meanwhile", "just", "directly", "slightly", "set",
    "against", "across", "scattered", "spread", "drawn", "in", "at", "on", "near", "along", "to", "you",
    "we", "has", "have", "written", "printed", "word", "them", "they", "among", "include", "includes",
    "including", "total", "different", "colored", "white", "light", "gray", "grey", "pale", "sized",
    "-", ",", ";", ":", "that", "where", "whereas", "but", "then", "as", "well", "one", "each", "both",
    "sitting", "resting", "completes", "complete", "completing", "row", "column", "same", "up", "look",
    "looks", "like", "simple", "computer", "flat", "clearly", "rather", "than", "photo", "create",
    "creates", "adds", "bright", "colors", "layout", "arrangement", "overall", "together", "draws",
    "closer", "too", "again", "very", "shapes", "by", "from", "side", "occupies", "occupy",
    "fills", "here", "see", "right", "left", "so", "what", "else", "more", "other", "for", "being",
}  # fmt: skip

PROMPT = "Describe this image in detail."
CHAT_WORDS = ("system", "user", "assistant")

_TOKEN = re.compile(r"[a-z]+|[0-9]+|[^\sa-z0-9]")


def words_of(text: str) -> list[str]:
    """Split text the way the tiny policy's tokenizer does: lowercase words, digits and single
    punctuation marks. ``len(words_of(text))`` is the policy's token count for in-vocabulary text."""
    return _TOKEN.findall(text.lower())


def all_words() -> list[str]:
    """Every word of the closed vocabulary, sorted (the tokenizer's word list)."""
    words: set[str] = set()
    tables = [
        KINDS, PLURALS.values(), COLORS, SIZES, TEXTURES, TEXT_WORDS, NUMBER_WORDS, SIZE_WORDS,
        GENERIC_SINGULAR, GENERIC_PLURAL, ROW_WORDS, COL_WORDS, CENTER_WORDS, POSITION_NOUNS,
        POSITION_PREPOSITIONS, FRAME_NOUNS, BACKGROUND_NOUNS, TEXT_VERBS, DETERMINERS_INDEFINITE,
        DETERMINERS_DEFINITE, RELATION_WORDS, CLAUSE_BREAKS, SENTENCE_ENDS, LIST_BULLETS, META_TRIGGERS, INFERENCE_TRIGGERS,
        FILLER_WORDS, CHAT_WORDS,
    ]  # fmt: skip
    for table in tables:
        for entry in table:
            words.update(words_of(entry))
    for sentence in (*META_SENTENCES, *INFERENCE_SENTENCES, PROMPT):
        words.update(words_of(sentence))
    words.update(str(i) for i in range(1, 10))  # numbered-list markers
    words.update(("(", ")"))
    return sorted(words)
