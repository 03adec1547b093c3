"""The one score every system gets in the protocol: sacreBLEU of detokenized text
against the raw references (run_protocol, decode_benchmark and dev_curves all call it)."""


def bleu(hypotheses, references) -> float:
    """Corpus sacreBLEU (its default 13a tokenization) of `hypotheses` against one
    reference each."""
    import sacrebleu
    return sacrebleu.corpus_bleu(hypotheses, [references]).score
