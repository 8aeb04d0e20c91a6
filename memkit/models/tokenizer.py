r"""A small byte-level BPE tokenizer for the tiny model, trained on the synthetic world.

Why train one: the tiny model learns from scratch on a 2-core CPU, so every vocabulary row
costs parameters and steps. A BPE of at most 4096 entries fitted to the world's own text (fictional names,
attribute words) gives short sequences; every XML-ish tag the methods use (``<think>``,
``<mem>``, ``<information>`` ...) is one *added* token, so

* a tag is always exactly one id (span detection and masks are exact, never "half a tag");
* tags are **not special**: ``decode(..., skip_special_tokens=True)`` keeps them, which the
  output parsers need. Only ``<pad> <bos> <eos>`` are special.

**Every word has one spelling, with its leading space** (``"ĠLibak"``), wherever it appears.
GPT-2's byte-level BPE glues a space onto the next word, so a name is ``"ĠLibak"`` after a space
but ``"L" "ibak"`` right after ``<search>`` or ``<answer>``: copying a name from ``<information>``
into a tag then means learning a second spelling per name, which a model trained from scratch
does not generalise (measured: docs/findings.md, 'Tokenizer'). Here the text between two tags
(and the start of a text) gets a space prepended when it begins with a word (normalizer
``Prepend(" ")``, then ``Replace(r"^ (?=\W)", "")`` takes it off again before a non-word
character), and the pre-tokenizer ``Split(r" ?\w+", isolated)`` keeps
a word together with the one space before it; the rest (punctuation, newlines, extra spaces) are
pieces of their own. The decoder drops the space again after a tag and at the start of the
text, so ``decode(encode(s)) == s`` for every ``s`` without a space right after a tag or at its
start (the canonical form every method writes; a space written there is lost, which the
parsers ignore anyway, as they strip whitespace inside tags). Only words right after a newline
or punctuation keep a second, space-less spelling: in MEM1's SFT data these are fixed words
("Q1", "Doc", "Title"), never names.

Why not the alternatives: the earlier ``words4`` scheme (no word carries a space; each space
between two words is a token of its own) also gives one spelling, but a third of MEM1's SFT
tokens were lone spaces that attention had to skip; glue5 runs ~1.5x more SFT steps a minute and
learns to copy sooner (measured: docs/findings.md, 'Tokenizer').

Numbers are BPE pieces, not whole tokens: a digit string is one pre-token that BPE cuts wherever
its merges fall (``" 1987"`` -> ``Ġ1987``, ``" 1934"`` -> ``Ġ193 4``). The tiny model answers
comparison questions ("who was born earlier, A or B?") near chance; splitting numbers into
digits or 3-digit groups did not fix that, so numbers stay whole pre-tokens (negative results:
docs/findings.md).

Byte-level means any string (other alphabets, emoji, typos) encodes without ``<unk>``.
No BOS/EOS is added automatically: the rollout engine decides what a context starts with.
"""

from __future__ import annotations

import re
from typing import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

#: Every tag used by any method (MEM1, MemSearcher, MemPO, MemAct, Mem-T). Order fixes their ids.
TAG_NAMES = ("think", "search", "answer", "information", "mem", "memory", "question", "tool_call", "note", "records")
TAGS: tuple[str, ...] = tuple(t for name in TAG_NAMES for t in (f"<{name}>", f"</{name}>"))
PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIAL_TOKENS = (PAD, BOS, EOS)  # ids 0, 1, 2

#: Bumped whenever the pre-tokenization changes, so cached tokenizers (and models) are not reused.
TOKENIZER_SCHEME = "glue5"  # glue5: words carry their leading space (words4: spaces were tokens of their own)
#: Default vocabulary size: most fictional names become one or two ids (copying is shorter).
DEFAULT_VOCAB = 4096
#: A word with the one space before it is a pre-token; the rest (punctuation, newlines) pieces of their own.
_WORD = r" ?\w+"

_TAG_RE = re.compile("|".join(re.escape(t) for t in sorted(TAGS, key=len, reverse=True)))


def train_tokenizer(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``texts`` and add the tag vocabulary.

    Args:
        texts: training corpus (passages, questions, oracle traces ...). Tags inside it are
            removed before training so no merges are wasted on pieces like ``"</th"``.
        vocab_size: total vocabulary including the 256 byte symbols, the 3 specials and the
            20 tags; must be > 256 + 3 + 20 to leave room for merges.

    Returns:
        a ``PreTrainedTokenizerFast`` with ``pad/bos/eos`` set and ``padding_side="left"``
        (decoder-only batched generation pads on the left). Deterministic: the same texts
        in the same order give the same vocabulary and merges.
    """
    if isinstance(texts, str):
        raise TypeError("train_tokenizer(texts) wants an iterable of strings, got one string; wrap it: [text]")
    corpus = [_TAG_RE.sub(" ", t) for t in texts]
    if not any(s.strip() for s in corpus):
        raise ValueError("train_tokenizer got no text; pass world_texts(make_world(seed)) or your own corpus")
    n_fixed = 256 + len(SPECIAL_TOKENS) + len(TAGS)
    if vocab_size <= n_fixed:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: bytes+specials+tags already take {n_fixed}; use >= 512"
        )

    tok = Tokenizer(models.BPE())
    # The normalizer runs on each piece of text between tags (tags are added tokens, matched
    # first): a piece starting with a word gets a leading space, so the word keeps one spelling.
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(" "), normalizers.Replace(Regex(r"^ (?=\W)"), "")])
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_WORD), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    after_tag = "|".join(re.escape(t) for t in TAGS)
    tok.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Replace(Regex(f"^ |(?<={after_tag}) "), "")])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TAGS),  # the tags are appended after training
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    # normalized=False: match the literal tag; special=False: decode keeps it.
    tok.add_tokens([AddedToken(t, normalized=False, special=False, single_word=False) for t in TAGS])

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    return fast


def tag_ids(tokenizer) -> dict[str, int]:
    """Map every tag to its single id; raises if the tokenizer splits one (not a memkit tokenizer)."""
    out = {}
    for t in TAGS:
        ids = tokenizer.encode(t, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(
                f"tag {t!r} is {len(ids)} tokens in this tokenizer; train it with memkit.models.train_tokenizer"
            )
        out[t] = ids[0]
    return out
