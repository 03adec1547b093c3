"""Translation quality and decode speed: sacreBLEU, chrF, and the paper's tokenized BLEU.

`bleu` and `chrf` are sacreBLEU's (detokenized text, its default 13a tokenizer,
signature reported): the comparable figures. `tok_bleu` is computed the way the
paper's EN-DE BLEU was (tensor2tensor's get_ende_bleu.sh): output and reference
tokenized with the Moses tokenizer (sacremoses, target language, no escaping),
hyphenated compounds split as "a-b" -> "a ##AT##-##AT## b", then BLEU on those
tokens (tokenize='none'). It is usually higher than sacreBLEU and is not
comparable with it; it is reported only to set figures beside the paper's table 2.
"""

from __future__ import annotations

import functools
import re
import time
from typing import Callable, Sequence

import keras
import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacremoses import MosesTokenizer

from tf_transformer.cli.batching import translate_sentences
from tf_transformer.config import Config
from tf_transformer.decoding.translator import Translator
from tf_transformer.inputs.corpus import Corpus
from tf_transformer.inputs.tokenizer import Tokenizer

_COMPOUND = re.compile(r"(\S)-(\S)")
TARGET_LANG = "de"  # the embedded corpus and the paper's table 2 are EN->DE
TOK_BLEU_NOTE = ("tok_bleu: paper-style tokenized BLEU (Moses tokenizer + compound split "
                 "a-b -> a ##AT##-##AT## b, tokenize=none); not comparable to sacreBLEU")


def split_compounds(text: str) -> str:
    """get_ende_bleu.sh's `s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g` (non-overlapping, as in perl)."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", text)


@functools.lru_cache(maxsize=None)
def _moses(lang: str) -> MosesTokenizer:
    return MosesTokenizer(lang=lang)  # loads its nonbreaking-prefix list: once per language


def paper_tokenize(text: str, lang: str = TARGET_LANG) -> str:
    """tokenizer.perl -l LANG (sacremoses, escape=False: no &quot; entities), then the split."""
    tokens = _moses(lang).tokenize(text.strip(), escape=False, return_str=True)
    return split_compounds(tokens)


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str],
                  target_lang: str = TARGET_LANG) -> dict:
    """{"bleu", "chrf", "tok_bleu"} (floats, 0-100) and {"bleu_signature", "chrf_signature"}.

    `target_lang` picks the Moses tokenizer's language for tok_bleu only.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    hypotheses, references = list(hypotheses), list(references)
    bleu, chrf, tok_bleu = BLEU(), CHRF(), BLEU(tokenize="none")
    bleu_score = bleu.corpus_score(hypotheses, [references]).score
    chrf_score = chrf.corpus_score(hypotheses, [references]).score
    tok_score = tok_bleu.corpus_score([paper_tokenize(h, target_lang) for h in hypotheses],
                                      [[paper_tokenize(r, target_lang) for r in references]]).score
    return {"bleu": bleu_score, "chrf": chrf_score, "tok_bleu": tok_score,
            "bleu_signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature())}


def evaluate_translator(translator: Translator, corpus: Corpus, batch_size: int = 32,
                        max_sentences: int = 0,
                        translate_fn: Callable = translate_sentences,
                        target_lang: str = TARGET_LANG) -> dict:
    """Translates `corpus.sources` (the first `max_sentences`, 0 = all) and scores them.

    Returns corpus_scores' entries plus "sentences", "sentences_per_sec" and
    "tokens_per_sec" (generated target tokens, EOS included), timed after one
    warm-up batch so that tracing is not counted, and "hypotheses". The timed
    pass is `translate_fn(translator, sources, batch_size)` (the binary's reports progress).
    `target_lang` is the Moses tokenizer's language for tok_bleu.
    """
    sources, references = corpus.sources, corpus.targets
    if max_sentences:
        sources, references = sources[:max_sentences], references[:max_sentences]
    translate_sentences(translator, sources[:batch_size], batch_size)  # trace once
    start = time.perf_counter()
    results = translate_fn(translator, sources, batch_size)
    seconds = max(time.perf_counter() - start, 1e-9)
    hypotheses = [r.texts[0] for r in results]
    scores = corpus_scores(hypotheses, references, target_lang)
    tokens = sum(r.lengths[0] for r in results)
    return {**scores, "sentences": len(sources), "sentences_per_sec": len(sources) / seconds,
            "tokens_per_sec": tokens / seconds, "hypotheses": hypotheses}


def dev_bleu_fn(corpus: Corpus, tokenizer: Tokenizer, config: Config, max_sentences: int = 500,
                batch_size: int | None = None, shards=None) -> Callable[[keras.Model], dict]:
    """For Trainer.train(evaluate_fn=...): live model -> {"dev_bleu": sacreBLEU}.

    Translates the first `max_sentences` pairs of `corpus` with a Translator
    around the live model (config.decode settings, sources up to
    config.data.max_length), built once so that its graph is traced once.
    With `shards` (training's distribution.Shards: `count`, `map`, `sum`), pair i
    goes to shard i % count: each replica of each worker translates its own on
    its device and BLEU is computed from the summed n-gram statistics, which is
    sacreBLEU's corpus score of all the pairs.
    """
    sources = corpus.sources[:max_sentences]
    references = corpus.targets[:max_sentences]
    cached: list = []  # [(model, translator)]: the trainer passes the same model each time

    def translator_of(model: keras.Model) -> Translator:
        if not cached or cached[0][0] is not model:
            cached[:] = [(model, Translator(model, tokenizer, config.decode,
                                            config.data.max_length))]
        return cached[0][1]

    def translate(translator: Translator, texts: list[str]) -> list[str]:
        results = translate_sentences(translator, texts, batch_size or config.decode.batch_size)
        return [r.texts[0] for r in results]

    def evaluate(model: keras.Model) -> dict:
        translator = translator_of(model)  # built once, before any thread
        if shards is None:
            return {"dev_bleu": BLEU().corpus_score(translate(translator, sources),
                                                    [references]).score}
        per_shard = shards.map(lambda shard: bleu_statistics(
            translate(translator, sources[shard::shards.count]),
            references[shard::shards.count]))
        return {"dev_bleu": bleu_from_statistics(shards.sum(np.sum(per_shard, axis=0)))}

    return evaluate


def bleu_statistics(hypotheses: Sequence[str], references: Sequence[str]) -> np.ndarray:
    """[hypothesis length, reference length, 4 matches, 4 totals] of sacreBLEU's
    corpus BLEU: summed over parts of a corpus, they give the corpus's score."""
    if not hypotheses:
        return np.zeros(10)
    score = BLEU().corpus_score(list(hypotheses), [list(references)])
    return np.array([score.sys_len, score.ref_len, *score.counts, *score.totals], np.float64)


def bleu_from_statistics(stats: np.ndarray) -> float:
    """sacreBLEU's corpus BLEU (its default settings) from `bleu_statistics`' sums."""
    bleu = BLEU()
    return BLEU.compute_bleu(correct=[int(c) for c in stats[2:6]],
                             total=[int(t) for t in stats[6:10]],
                             sys_len=int(stats[0]), ref_len=int(stats[1]),
                             smooth_method=bleu.smooth_method, smooth_value=bleu.smooth_value,
                             effective_order=bleu.effective_order,
                             max_ngram_order=bleu.max_ngram_order).score


def combine(*evaluate_fns: Callable[[keras.Model], dict] | None) -> Callable[[keras.Model], dict]:
    """One evaluate_fn running each given one (None skipped) and merging their dicts."""
    fns = [fn for fn in evaluate_fns if fn is not None]

    def evaluate(model: keras.Model) -> dict:
        metrics = {}
        for fn in fns:
            metrics.update(fn(model))
        return metrics

    return evaluate
