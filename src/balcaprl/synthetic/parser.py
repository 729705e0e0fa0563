"""Closed-vocabulary caption parser: a caption -> atomic assertions, decided against a scene graph.

What a judge model does with a caption, done exactly for the synthetic world's vocabulary:

1. split into sentences (``.``) and clauses (``,``, ``and``, ``which``...), after removing list markers;
2. chunk each clause: noun phrases ("a large red circle"), counts ("three shapes"), positions ("in the
   top left corner"), relations ("to the left of" + noun phrase), printed words ("with the word go"),
   the background ("a striped background"), meta-commentary and inference words; anything else is an
   unparsed word;
3. attach positions, printed words and relations to the noun phrase they are about, bind each noun
   phrase to the one scene object it can name (kind and colour are unique within a scene), and
   emit atomic assertions: object existence, size, position, printed word, relation, count,
   background, plus non-pointable commentary (meta, inference, unclear fragments).

Each assertion has a canonical ``key`` (about scene objects, not words), so a caption covers a
reference assertion exactly when it makes a *true* assertion with the same key, however it is worded.
The parse also records the measurable style facts the linguistic scores are computed from.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from balcaprl.synthetic import lexicon as lx
from balcaprl.synthetic.scenes import Scene, SceneObject

AssertionKind = Literal[
    "object", "size", "position", "text", "relation", "count", "background", "meta", "inference", "unclear"
]
POINTABLE_KINDS = {"object", "size", "position", "text", "relation", "count", "background"}

_REL_PATTERNS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("to", "the", "left", "of"), "left_of"),
    (("to", "the", "right", "of"), "right_of"),
    (("left", "of"), "left_of"),
    (("right", "of"), "right_of"),
    (("above",), "above"),
    (("below",), "below"),
    (("beneath",), "below"),
    (("under",), "below"),
)
_REL_BY_FIRST: dict[str, list[tuple[tuple[str, ...], str]]] = {}
for _pattern, _name in _REL_PATTERNS:
    _REL_BY_FIRST.setdefault(_pattern[0], []).append((_pattern, _name))
_POSITION_STARTS = (
    lx.POSITION_PREPOSITIONS | {"the"} | set(lx.ROW_WORDS) | set(lx.COL_WORDS) | lx.CENTER_WORDS
)
_NP_ADJECTIVES = set(lx.SIZE_WORDS) | set(lx.COLORS) | {"-", "sized"}
_SINGULAR_NOUNS = set(lx.KINDS) | lx.GENERIC_SINGULAR
_PLURAL_TO_KIND = {plural: kind for kind, plural in lx.PLURALS.items()}
_PLURAL_NOUNS = set(_PLURAL_TO_KIND) | lx.GENERIC_PLURAL
_KNOWN_WORDS = set(lx.all_words())
# Words that may stand outside any construction without being a parse failure.
_NEUTRAL_WORDS = (
    lx.FILLER_WORDS
    | lx.TEXT_VERBS
    | lx.BACKGROUND_NOUNS
    | lx.FRAME_NOUNS
    | lx.POSITION_NOUNS
    | lx.DETERMINERS_INDEFINITE
    | lx.DETERMINERS_DEFINITE
    | lx.POSITION_PREPOSITIONS
    | lx.GENERIC_PLURAL
) - {"right", "left"}


@dataclass(frozen=True)
class Assertion:
    """One atomic assertion: its text, canonical key, and the two verdict flags."""

    kind: AssertionKind
    text: str
    key: tuple
    pointable: bool
    visible: bool


@dataclass
class ParsedCaption:
    """Assertions in caption order, plus the style facts the linguistic scores use."""

    assertions: list[Assertion] = field(default_factory=list)
    n_words: int = 0  # tokens, punctuation included (the policy's token count)
    n_sentences: int = 0
    sentence_lengths: list[int] = field(default_factory=list)
    max_ands: int = 0  # most "and"s in one sentence
    list_markers: int = 0
    unparsed_words: int = 0
    unknown_words: int = 0
    agreement_errors: int = 0
    duplicate_sentences: int = 0
    duplicate_assertions: int = 0
    repeated_openers: int = 0  # sentences opening with the same two words as an earlier one
    empty_sentences: int = 0  # sentences that assert nothing at all (not even commentary)
    stutters: int = 0  # a word repeated immediately ("the the")
    scene_objects: int = 0  # shapes in the image: how much there is to say (the linguistic judge sees it)


# --- chunks ------------------------------------------------------------------------------------------
@dataclass
class _Mention:
    kind: str | None  # None for a generic "shape"
    color: str | None
    size: str | None
    definite: bool
    words: str
    position: tuple[int, int] | None = None
    text: str | None = None
    obj: SceneObject | None = None
    resolved: bool = False


@dataclass
class _Chunk:
    type: str  # np, count, pos, rel, text, bg, meta, inference
    value: object = None


def _match(tokens: list[str], i: int, pattern: tuple[str, ...]) -> bool:
    return tuple(tokens[i : i + len(pattern)]) == pattern


def _chunk_clause(tokens: list[str], parsed: ParsedCaption) -> list[_Chunk]:
    chunks: list[_Chunk] = []
    i, n = 0, len(tokens)
    while i < n:
        t = tokens[i]
        # relation words ("to the left of") must win over position words ("on the left")
        rel = next(((p, name) for p, name in _REL_BY_FIRST.get(t, ()) if _match(tokens, i, p)), None)
        if rel:
            chunks.append(_Chunk("rel", rel[1]))
            i += len(rel[0])
            continue
        j = _position_end(tokens, i) if t in _POSITION_STARTS else i
        if j > i:
            chunks.append(_Chunk("pos", _position_cell(tokens[i:j])))
            i = j
            continue
        if t in lx.NUMBER_WORDS and i + 1 < n and tokens[i + 1] != "of":
            j, np_ = _noun_phrase(tokens, i + 1)
            if np_ is not None:
                number = lx.NUMBER_WORDS[t]
                kind, color, size, plural = np_
                if (number == 1) == plural:
                    parsed.agreement_errors += 1
                chunks.append(_Chunk("count", (kind, color, size, number, " ".join(tokens[i:j]))))
                i = j
                continue
        if (
            t in lx.DETERMINERS_INDEFINITE
            or t in lx.DETERMINERS_DEFINITE
            or t in _NP_ADJECTIVES
            or t in _SINGULAR_NOUNS
            or t in _PLURAL_NOUNS
        ):
            start = i + 1 if t in lx.DETERMINERS_INDEFINITE or t in lx.DETERMINERS_DEFINITE else i
            j, np_ = _noun_phrase(tokens, start)
            if np_ is not None:
                kind, color, size, plural = np_
                if t in ("a", "an", "another") and plural:
                    parsed.agreement_errors += 1
                if t in ("a", "an") and start < n:
                    vowel = tokens[start][:1] in "aeiou"
                    parsed.agreement_errors += int(vowel != (t == "an"))
                if not plural:
                    chunks.append(
                        _Chunk("np", _Mention(kind, color, size, t == "the", " ".join(tokens[i:j])))
                    )
                i = j
                continue
        if t == "word" and i + 1 < n and tokens[i + 1] in lx.TEXT_WORDS:
            chunks.append(_Chunk("text", tokens[i + 1]))
            i += 2
            continue
        if t in lx.TEXT_VERBS and i + 1 < n and tokens[i + 1] in lx.TEXT_WORDS:
            chunks.append(_Chunk("text", tokens[i + 1]))
            i += 2
            continue
        if t in lx.TEXTURES and any(w in lx.BACKGROUND_NOUNS for w in tokens[i + 1 : i + 4]):
            chunks.append(_Chunk("bg", t))
            i += 1
            continue
        if t in lx.BACKGROUND_NOUNS:
            texture = next((w for w in tokens[i + 1 :] if w in lx.TEXTURES), None)
            if texture:
                chunks.append(_Chunk("bg", texture))
                i = tokens.index(texture, i + 1) + 1
                continue
        if t in lx.SIZE_WORDS or t in lx.COLORS:  # predicative: "the circle is large"
            chunks.append(_Chunk("adj", ("size", lx.SIZE_WORDS[t]) if t in lx.SIZE_WORDS else ("color", t)))
        elif t in lx.META_TRIGGERS:
            chunks.append(_Chunk("meta"))
        elif t in lx.INFERENCE_TRIGGERS:
            chunks.append(_Chunk("inference"))
        elif t not in _NEUTRAL_WORDS:
            parsed.unparsed_words += 1
            parsed.unknown_words += t not in _KNOWN_WORDS
        i += 1
    return chunks


def _noun_phrase(
    tokens: list[str], i: int
) -> tuple[int, tuple[str | None, str | None, str | None, bool] | None]:
    """Adjectives* noun starting at ``i`` -> (end, (kind, colour, size, plural)), or (i, None)."""
    color = size = None
    j = i
    while j < len(tokens) and tokens[j] in _NP_ADJECTIVES:
        w = tokens[j]
        if w in lx.SIZE_WORDS:
            size = lx.SIZE_WORDS[w]
        elif w in lx.COLORS:
            color = w
        j += 1
    if j < len(tokens):
        noun = tokens[j]
        if noun in _SINGULAR_NOUNS:
            return j + 1, (noun if noun in lx.KINDS else None, color, size, False)
        if noun in _PLURAL_NOUNS:
            return j + 1, (_PLURAL_TO_KIND.get(noun), color, size, True)
    return i, None


def _position_end(tokens: list[str], i: int) -> int:
    """End of a position phrase starting at ``i`` ("in the top left corner of the image"), or ``i``."""
    n = len(tokens)
    j = i
    if j < n and tokens[j] in lx.POSITION_PREPOSITIONS:
        j += 1
    if j < n and tokens[j] == "the":
        j += 1
    k = j
    while k < n and (tokens[k] in lx.ROW_WORDS or tokens[k] in lx.COL_WORDS or tokens[k] in lx.CENTER_WORDS):
        k += 1
    if k == j:
        return i
    if k < n and tokens[k] == "of":
        after = tokens[k + 2] if k + 2 < n and tokens[k + 1] == "the" else None
        if after in lx.ROW_WORDS or after in lx.COL_WORDS or after in lx.CENTER_WORDS:
            end = _position_end(tokens, k + 1)  # "the middle of the left side"
            return end if end > k + 1 else k
        if after in lx.FRAME_NOUNS:
            return k + 3  # "the center of the image"
        return i  # "the left of the red circle": a relation, not a position
    while k < n and tokens[k] in lx.POSITION_NOUNS:
        k += 1
    if k + 2 < n and tokens[k] == "of" and tokens[k + 1] == "the" and tokens[k + 2] in lx.FRAME_NOUNS:
        k += 3
    return k


def _position_cell(words: list[str]) -> tuple[int, int]:
    row = next((lx.ROW_WORDS[w] for w in words if w in lx.ROW_WORDS), 1)
    col = next((lx.COL_WORDS[w] for w in words if w in lx.COL_WORDS), 1)
    return (row, col)


# --- binding and assertions ----------------------------------------------------------------------------
def _candidates(scene: Scene, m: _Mention) -> list[SceneObject]:
    return [
        o
        for o in scene.objects
        if (m.kind is None or o.kind == m.kind) and (m.color is None or o.color == m.color)
    ]


def _resolve(scene: Scene, m: _Mention) -> None:
    """Bind a mention to the scene object it names (best match on what else the caption says)."""
    if m.resolved:
        return
    m.resolved = True
    cands = _candidates(scene, m)
    if not cands:
        return
    if m.kind is None and m.color is None:
        return  # "a shape": names nothing in particular

    def score(o: SceneObject) -> tuple[int, int]:
        s = (m.size == o.size) + (m.position == o.cell) + (m.text is not None and m.text == o.text)
        return (s, -scene.objects.index(o))

    m.obj = max(cands, key=score)


def _label(m: _Mention) -> str:
    words = [w for w in (m.color, m.kind or "shape") if w]
    return " ".join(words)


def _a(phrase: str) -> str:
    return ("an " if phrase[:1] in "aeiou" else "a ") + phrase


def _obj_key(m: _Mention) -> tuple:
    return ("obj", m.obj.kind, m.obj.color) if m.obj is not None else ("missing", m.kind, m.color)


@dataclass
class _SentenceState:
    """What a sentence has said so far; attachments may arrive in a later clause than their noun."""

    mentions: list[_Mention] = field(default_factory=list)
    relations: list[tuple[_Mention, str, _Mention]] = field(default_factory=list)
    last: _Mention | None = None  # most recent mention, for dangling ", with the word go written on it"
    pending_rels: list[tuple[str, _Mention]] = field(default_factory=list)  # "to the right of X, <subject>"
    pending_pos: tuple[int, int] | None = None  # "in the top left corner, there is <subject>"
    pending_text: str | None = None


class _CaptionParser:
    def __init__(self, scene: Scene, rubric: str) -> None:
        self.scene = scene
        self.rubric = rubric
        self.parsed = ParsedCaption()
        self.introduced: set[tuple] = set()
        self.said_at: dict[tuple[int, int], set[str]] = {}  # the kind and colour words said of a cell
        self.seen_keys: set[tuple] = set()

    # assertions -------------------------------------------------------------------------------------
    def emit(self, kind: AssertionKind, text: str, key: tuple, visible: bool) -> None:
        if kind in ("meta", "unclear"):
            pointable = False
        elif kind == "inference":
            pointable = self.rubric == "evaluation"
        else:
            pointable = True
        if key in self.seen_keys:
            self.parsed.duplicate_assertions += 1
        self.seen_keys.add(key)
        self.parsed.assertions.append(Assertion(kind, text, key, pointable, visible))

    def mention(self, m: _Mention) -> None:
        _resolve(self.scene, m)
        if m.position is not None:
            self._placed_mention(m)
            return
        label = _label(m)
        obj = m.obj
        if m.kind is not None or m.color is not None:
            ident = (m.kind, m.color)
            if not m.definite or not self._introduced(ident):
                self.emit("object", f"there is {_a(label)}", ("object", m.kind, m.color), obj is not None)
            self.introduced.add(ident)
        if m.size:
            self.emit(
                "size",
                f"the {label} is {m.size}",
                ("size", _obj_key(m), m.size),
                obj is not None and obj.size == m.size,
            )
        if m.text:
            self.emit(
                "text",
                f"the {label} shows the word {m.text}",
                ("text", _obj_key(m), m.text),
                obj is not None and obj.text == m.text,
            )

    def _placed_mention(self, m: _Mention) -> None:
        """A shape said to be somewhere, split into the shortest claims, as the paper's decomposition
        asks: a shape is there, and each thing said of it (size, colour, kind, printed word) is a claim
        of its own about the shape in that cell. So a shape placed right and described right is right
        claim by claim, and a reference's claims are covered one by one. Each claim's text is a
        sentence this parser reads back to the same key (the judge client's cached-reference mode
        sends reference assertions as the reference).

        A placement that no shape of the image fits (an empty cell, or a cell whose shape it
        contradicts in size, colour, kind or word) is an object that is not there: the paper's judge
        fails a hallucinated object on visual verification, so every claim about it is false and
        covers nothing (:meth:`_phantom`). A placement that fits the cell's shape describes that
        shape: said again, its claims are repeats, which the linguistic judge charges."""
        cell = m.position
        assert cell is not None
        there = next((o for o in self.scene.objects if o.cell == cell), None)
        if m.kind is not None or m.color is not None:
            self.introduced.add((m.kind, m.color))
        self.said_at.setdefault(cell, set()).update(w for w in (m.kind, m.color) if w is not None)
        said = {"size": m.size, "color": m.color, "kind": m.kind, "text": m.text}
        if there is None or any(v is not None and getattr(there, a) != v for a, v in said.items()):
            self._phantom(m, cell)
            return
        where = f"at the {lx.CELL_NAMES[cell]}"
        self.emit("position", f"there is a shape {where}", ("position", cell), True)
        claims = (
            ("size", m.size, "size", f"{m.size} shape"),
            ("object", m.color, "color", f"{m.color} shape"),
        )
        claims += (("object", m.kind, "kind", m.kind),)
        for kind, value, attribute, noun_phrase in claims:
            if value is not None:
                self.emit(kind, f"there is {_a(noun_phrase)} {where}", (attribute, cell, value), True)
        if m.text:
            self.emit("text", f"the shape {where} shows the word {m.text}", ("text", cell, m.text), True)

    def _phantom(self, m: _Mention, cell: tuple[int, int]) -> None:
        """A shape the image does not hold: the same claims a placed shape makes (it is there, its
        size, colour, kind, word), all false, keyed by the whole description, so they repeat only the
        same phantom and cover only a reference that makes the same mistake. Each text names the whole
        phantom, so it reads back to the same keys."""
        described = " ".join(w for w in (m.size, m.color, m.kind or "shape") if w)
        if m.text:
            described += f" with the word {m.text}"
        where = f"at the {lx.CELL_NAMES[cell]}"
        ident = ("phantom", cell, m.size, m.color, m.kind, m.text)
        self.emit("position", f"there is {_a(described)} {where}", (*ident, "position"), False)
        the = f"the {described} {where}"
        claims = (("size", m.size, f"{the} is {m.size}"), ("color", m.color, f"{the} is {m.color}"))
        claims += (
            ("kind", m.kind, f"the {described} sits {where}"),
            ("text", m.text, f"{the} shows the word {m.text}"),
        )
        for attribute, value, text in claims:
            if value is not None:
                kind: AssertionKind = {"size": "size", "text": "text"}.get(attribute, "object")  # type: ignore[assignment]
                self.emit(kind, text, (*ident, attribute), False)

    def _introduced(self, ident: tuple[str | None, str | None]) -> bool:
        """Has the caption introduced the shape "the <colour> <kind>" refers to: named whole, or its
        kind and colour said of one cell in claims of their own ("a red shape at the top", "a circle
        at the top")?"""
        words = {w for w in ident if w is not None}
        return ident in self.introduced or any(words <= said for said in self.said_at.values())

    def relation(self, a: _Mention, rel: str, b: _Mention) -> None:
        _resolve(self.scene, a)
        _resolve(self.scene, b)
        # left_of(a, b) is right_of(b, a): one canonical key per fact, however it is worded
        first, second = (a, b) if rel in ("left_of", "above") else (b, a)
        axis = "h" if rel in ("left_of", "right_of") else "v"
        key = ("relation", axis, _obj_key(first), _obj_key(second))
        visible = False
        if first.obj is not None and second.obj is not None and first.obj is not second.obj:
            visible = first.obj.col < second.obj.col if axis == "h" else first.obj.row < second.obj.row
        words = {
            "left_of": "to the left of",
            "right_of": "to the right of",
            "above": "above",
            "below": "below",
        }[rel]
        self.emit("relation", f"the {_label(a)} is {words} the {_label(b)}", key, visible)

    def count(self, kind: str | None, color: str | None, size: str | None, number: int, words: str) -> None:
        actual = sum(
            (kind is None or o.kind == kind)
            and (color is None or o.color == color)
            and (size is None or o.size == size)
            for o in self.scene.objects
        )
        verb = "is" if number == 1 else "are"
        self.emit("count", f"there {verb} {words}", ("count", kind, color, size, number), actual == number)

    # structure --------------------------------------------------------------------------------------
    def parse(self, caption: str) -> ParsedCaption:
        tokens = lx.words_of(caption)
        self.parsed.n_words = len(tokens)
        self.parsed.scene_objects = len(self.scene.objects)
        self.parsed.stutters = sum(a == b and a.isalpha() for a, b in zip(tokens, tokens[1:], strict=False))
        openers: Counter[tuple[str, ...]] = Counter()
        seen_sentences: set[tuple[str, ...]] = set()
        for sentence in self._sentences(tokens):
            self.parsed.n_sentences += 1
            self.parsed.sentence_lengths.append(len(sentence))
            self.parsed.max_ands = max(self.parsed.max_ands, sentence.count("and"))
            self.parsed.duplicate_sentences += tuple(sentence) in seen_sentences
            seen_sentences.add(tuple(sentence))
            opener = tuple(sentence[:2])
            self.parsed.repeated_openers += openers[opener] > 0 and len(sentence) > 3
            openers[opener] += 1
            self._agreement(sentence)
            self._sentence(sentence)
        return self.parsed

    def _sentences(self, tokens: list[str]) -> list[list[str]]:
        """Split at sentence ends; numbered-list markers and bullets are counted and dropped."""
        sentences: list[list[str]] = [[]]
        i = 0
        while i < len(tokens):
            t = tokens[i]
            at_start = not sentences[-1]
            if at_start and t.isdigit() and i + 1 < len(tokens) and tokens[i + 1] in (".", ")"):
                self.parsed.list_markers += 1
                i += 2
                continue
            if at_start and t in lx.LIST_BULLETS:
                self.parsed.list_markers += 1
            elif t in lx.SENTENCE_ENDS:
                sentences.append([])
            else:
                sentences[-1].append(t)
            i += 1
        return [s for s in sentences if s]

    def _agreement(self, sentence: list[str]) -> None:
        """'there is three circles', 'there are a circle' (a/an and noun number are checked in chunks)."""
        for i in range(len(sentence) - 2):
            if sentence[i] != "there":
                continue
            verb, nxt = sentence[i + 1], sentence[i + 2]
            if (
                verb == "is"
                and lx.NUMBER_WORDS.get(nxt, 1) > 1
                or verb == "are"
                and nxt in ("a", "an", "one")
            ):
                self.parsed.agreement_errors += 1

    def _sentence(self, sentence: list[str]) -> None:
        clauses: list[list[str]] = [[]]
        for t in sentence:
            if t in lx.CLAUSE_BREAKS:
                clauses.append([])
            else:
                clauses[-1].append(t)
        state = _SentenceState()
        n_start = len(self.parsed.assertions)
        meta_clauses: list[str] = []
        inference_clauses: list[str] = []
        for clause in clauses:
            if not clause:
                continue
            unparsed_before = self.parsed.unparsed_words
            n_before = len(self.parsed.assertions)
            chunks = _chunk_clause(clause, self.parsed)
            self._clause(chunks, state)
            types = {c.type for c in chunks}
            if "meta" in types:
                meta_clauses.append(" ".join(clause))
            if "inference" in types:
                inference_clauses.append(" ".join(clause))
            if (
                not types
                and len(self.parsed.assertions) == n_before
                and self.parsed.unparsed_words > unparsed_before
            ):
                self.emit("unclear", " ".join(clause), ("unclear", tuple(clause)), False)
        for m in state.mentions:  # attachments are complete now: bind and emit
            self.mention(m)
        for a, rel, b in state.relations:
            self.relation(a, rel, b)
        if meta_clauses:
            text = ", ".join(meta_clauses)
            self.emit("meta", text, ("meta", text), True)  # not false, just not something to point at
        if inference_clauses:
            text = ", ".join(inference_clauses)
            self.emit("inference", text, ("inference", text), True)
        if all(a.kind == "unclear" for a in self.parsed.assertions[n_start:]):
            self.parsed.empty_sentences += 1

    def _clause(self, chunks: list[_Chunk], state: _SentenceState) -> None:
        subject: _Mention | None = None
        rels: list[tuple[str, _Mention]] = []
        waiting_rel: str | None = None
        clause_mentions: list[_Mention] = []
        for c in chunks:
            if c.type == "np":
                m: _Mention = c.value  # type: ignore[assignment]
                clause_mentions.append(m)
                state.mentions.append(m)
                if waiting_rel:
                    rels.append((waiting_rel, m))
                    waiting_rel = None
                else:
                    subject = m
                    if state.pending_pos is not None:
                        m.position, state.pending_pos = state.pending_pos, None
                    if state.pending_text is not None:
                        m.text, state.pending_text = state.pending_text, None
                state.last = m
            elif c.type == "rel":
                waiting_rel = c.value  # type: ignore[assignment]
            elif c.type == "pos":
                target = subject if subject is not None else (state.last if not clause_mentions else None)
                if target is not None and target.position is None:
                    target.position = c.value  # type: ignore[assignment]
                elif target is None:
                    state.pending_pos = c.value  # type: ignore[assignment]
            elif c.type == "text":
                target = clause_mentions[-1] if clause_mentions else state.last
                if target is not None:
                    target.text = c.value  # type: ignore[assignment]
                else:
                    state.pending_text = c.value  # type: ignore[assignment]
            elif c.type == "adj":
                what, value = c.value  # type: ignore[misc]
                target = subject or state.last
                if target is None:
                    self.parsed.unparsed_words += 1  # an adjective about nothing
                elif getattr(target, what) is None:
                    setattr(target, what, value)
            elif c.type == "count":
                kind, color, size, number, words = c.value  # type: ignore[misc]
                self.count(kind, color, size, number, words)
            elif c.type == "bg":
                texture = str(c.value)
                self.emit(
                    "background",
                    f"the background is {texture}",
                    ("background", texture),
                    self.scene.texture == texture,
                )
        if waiting_rel is not None:
            self.parsed.unparsed_words += 1  # "to the left of" with nothing after it
        if subject is not None:
            state.relations += [(subject, rel, obj) for rel, obj in state.pending_rels + rels]
            state.pending_rels = []
        else:
            state.pending_rels += rels


def parse_caption(caption: str, scene: Scene, rubric: str = "training") -> ParsedCaption:
    """Decompose ``caption`` into atomic assertions decided against ``scene``.

    ``rubric="evaluation"`` is the paper's looser b-CapScore rubric: evidence-based inferences
    ("a simple computer generated illustration") count as pointable; everything else is the same.
    """
    return _CaptionParser(scene, rubric).parse(caption)
