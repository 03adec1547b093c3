"""The four WMT14 recipes on TFDS mock data.

`make test` reads each recipe's flags into its training options (the paper's sizes,
schedule and dtype) and opens its train and dev specs (`tfds:wmt14_translate/...`) as
streams, then runs the first recipe end to end: train (reading its stream, dev loss and
BLEU from its validation split), average, evaluate on its test split. Only sizes are
overridden there: the token budget, the steps (2, the 2 averaged) and a tiny width (1+1
layers of d_model 32); the vocabulary is given (the recipes' 32-37k pieces cannot be
learned from mock sentences). The four differ only in flags and data specs, so one
training covers the path the others take; each binary runs in this process
(tfds_fixtures.run_mains_on_mock_data: each launch would import TensorFlow).
`make test-recipes` runs the whole chain (train, average, translate, evaluate, export)
for all four at that width and at the recipes' own base and big sizes (tens of minutes
on a CPU), each binary in a process of its own (tfds_fixtures.run_binary).
"""

import os

import pytest
from absl import flags
from binary_fixtures import binary_module
from tfds_fixtures import REPO_ROOT, binary_env, run_binary, run_mains_on_mock_data

pytestmark = pytest.mark.slow

RECIPES = ["wmt14_en_de_base", "wmt14_en_de_big", "wmt14_en_fr_base", "wmt14_en_fr_big"]
MOCK_EXAMPLES = 16
# make test: 4 examples a split, enough for 4 test sentences; the dev loss then reads one
# batch (one trace of its function).
MOCK_EXAMPLES_HERE = 4
# The paper's models (Table 3) and the recipes' choices: (d_model, d_ff, heads, P_drop,
# steps, vocabulary pieces, checkpoints averaged).
PAPER = {"wmt14_en_de_base": (512, 2048, 8, 0.1, 100000, 37000, 5),
         "wmt14_en_de_big": (1024, 4096, 16, 0.3, 300000, 37000, 20),
         "wmt14_en_fr_base": (512, 2048, 8, 0.1, 100000, 32000, 5),
         "wmt14_en_fr_big": (1024, 4096, 16, 0.1, 300000, 32000, 20)}
SIZES = ["--tokens_per_batch=256", "--max_steps=2", "--eval_every=2"]
EVERY_STEP = ["--checkpoint_steps=1"]  # the 2 checkpoints averaged
TINY = ["--num_layers=1", "--d_model=32", "--d_ff=64", "--num_heads=2"]
DEV_BLEU = ["--dev_bleu_sentences=2"]


def _run(module, runs, timeout):
    """The runs in one process of their own (tfds_fixtures.run_binary): their stdout."""
    result = run_binary(module, runs, MOCK_EXAMPLES, binary_env(), timeout)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
    return result.stdout


def _run_here(module, runs, timeout=None):
    """The runs in this process (tfds_fixtures.run_mains_on_mock_data): their stdout."""
    del timeout
    results = run_mains_on_mock_data(module, runs, MOCK_EXAMPLES_HERE)
    for result in results:
        assert result["code"] == 0, (result["stdout"][-2000:], result["stderr"][-4000:])
    return "".join(result["stdout"] for result in results)


def _recipe_file(recipe):
    return os.path.join(REPO_ROOT, "tf_transformer", "recipes", recipe + ".flags")


def _flagfile(recipe):
    return f"--flagfile={_recipe_file(recipe)}"


def _train(dirs, vocab, overrides, recipes=RECIPES, run=_run):
    """Trains `recipes` (dev BLEU of 2 sentences, a checkpoint every step)."""
    trained = run("tf_transformer.train", [
        [_flagfile(r), f"--vocab={vocab}", f"--model_dir={dirs[r]}", *overrides, *EVERY_STEP,
         *DEV_BLEU] for r in recipes], timeout=3600)
    lines = trained.splitlines()
    done = [line for line in lines if line.startswith("done ")]
    assert len(done) == len(recipes) and all("step=2 " in d and "stopped_by=max_steps" in d
                                             for d in done), done
    evals = [line for line in lines if line.startswith("eval step=2 ")]
    assert len(evals) == len(recipes), evals
    assert all("dev_loss=" in e and "dev_bleu=" in e for e in evals), evals


def test_each_recipe_reads_as_the_papers_model_and_opens_its_tfds_streams(tmp_path):
    """Each recipe's flags as the training binary reads them (every flag reset between
    them): the paper's model, schedule, batch of 25000 tokens on 8 GPUs and regularisation,
    mixed_bfloat16, its pair's train and validation splits, which yield pairs from TFDS
    (mock data)."""
    import tensorflow_datasets as tfds

    from tf_transformer.inputs import corpus, streamed

    for recipe, (d_model, d_ff, heads, dropout, steps, pieces, averaged) in PAPER.items():
        with binary_module("tf_transformer.train") as train:
            flags.FLAGS(["train", _flagfile(recipe), f"--model_dir={tmp_path / recipe}"])
            options = train.train_options()
        model, schedule, data = options.config.model, options.config.train, options.config.data
        assert (model.d_model, model.d_ff, model.num_heads, model.num_layers,
                model.dropout) == (d_model, d_ff, heads, 6, dropout), recipe
        assert (schedule.warmup_steps, schedule.label_smoothing, schedule.dtype,
                schedule.max_steps, schedule.average_last) == (
                    4000, 0.1, "mixed_bfloat16", steps, averaged), recipe
        assert data.tokens_per_batch * 8 * schedule.accum_steps == 25000, recipe
        with open(_recipe_file(recipe), encoding="utf-8") as f:
            assert "tokens_per_batch (per replica) x replicas x accum_steps" in f.read(), recipe
        assert options.vocabularies.size == pieces and not options.vocabularies.shared
        pair = recipe.split("_")[1] + "-" + recipe.split("_")[2]
        assert (options.train_data, options.dev_data) == (
            f"tfds:wmt14_translate/{pair}:train", f"tfds:wmt14_translate/{pair}:validation")
        with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES_HERE):
            train_pairs = list(streamed.open_corpus(options.train_data).examples())
            dev = corpus.read_corpus(options.dev_data)
        assert len(train_pairs) == len(dev.sources) == MOCK_EXAMPLES_HERE, recipe


def test_a_recipe_trains_on_mock_data_then_averages_and_evaluates(tmp_path, spm_model_path):
    """The first recipe's TFDS stream (dev loss and BLEU from its validation split) and
    mixed_bfloat16 training, 2 steps at a tiny width; its 2 checkpoints averaged and
    evaluated on its TFDS test split."""
    dirs = {r: str(tmp_path / r) for r in RECIPES}
    _train(dirs, spm_model_path, SIZES + TINY, recipes=RECIPES[:1], run=_run_here)
    first = dirs[RECIPES[0]]
    averaged = _run_here("tf_transformer.average_checkpoints",
                         [[f"--model_dir={first}", f"--output={first}_avg", "--num_last=2"]])
    assert "averaged last 2 checkpoints" in averaged
    evaluated = _run_here("tf_transformer.evaluate", [
        [f"--model_dir={first}_avg", "--max_sentences=4", "--noprogress", "--beam_size=2",
         "--extra_length=5", "--data=tfds:wmt14_translate/en-de:test"]])
    scores = [line for line in evaluated.splitlines() if line.startswith("bleu=")]
    assert len(scores) == 1 and " sentences=4 " in scores[0], evaluated


@pytest.mark.recipes
@pytest.mark.parametrize("scale", ["tiny", "paper"])
def test_recipes_train_average_translate_evaluate_export(tmp_path, spm_model_path, scale):
    dirs = {r: str(tmp_path / r) for r in RECIPES}
    _train(dirs, spm_model_path, SIZES + (TINY if scale == "tiny" else []))
    averaged = _run("tf_transformer.average_checkpoints", [
        [f"--model_dir={dirs[r]}", f"--output={dirs[r]}_avg", "--num_last=2"]
        for r in RECIPES], timeout=1200)
    assert averaged.count("averaged last 2 checkpoints") == 4
    source = tmp_path / "input.txt"
    source.write_text("a house\nthe cat sat on the mat\n", encoding="utf-8")
    _run("tf_transformer.translate", [
        [f"--model_dir={dirs[r]}_avg", f"--input={source}", f"--output={dirs[r]}.out"]
        for r in RECIPES], timeout=1200)
    for r in RECIPES:
        with open(f"{dirs[r]}.out", encoding="utf-8") as f:
            assert len(f.read().splitlines()) == 2, r
    evaluated = _run("tf_transformer.evaluate", [
        [f"--model_dir={dirs[r]}_avg", "--max_sentences=4", "--noprogress",
         "--data=tfds:wmt14_translate/{}-{}:test".format(*r.split("_")[1:3])]
        for r in RECIPES], timeout=1200)
    scores = [line for line in evaluated.splitlines() if line.startswith("bleu=")]
    assert len(scores) == 4 and all(" sentences=4 " in line for line in scores), evaluated
    exported = _run("export.__main__", [
        [f"--model_dir={dirs[r]}_avg", f"--export_dir={dirs[r]}_export", "--warmup_sentences="]
        for r in RECIPES], timeout=2400)
    for r in RECIPES:
        assert os.path.exists(os.path.join(dirs[r] + "_export", "1", "saved_model.pb")), exported
