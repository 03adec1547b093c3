"""The four WMT14 recipes run end to end on TFDS mock data: train (reading
`tfds:wmt14_translate/...` as a stream, dev loss and BLEU from its validation split),
average, translate, evaluate on the test split and export, each binary once for all
four recipes.

Only sizes are overridden: the token budget and the steps (2, the 2 averaged); the
vocabulary is given (the recipes' 32-37k pieces cannot be learned from mock sentences).
`make test` trains the four at a tiny width (1+1 layers of d_model 32; dev BLEU of 2
sentences for the first, dev loss for all: the path is the same) in its own process
(tfds_fixtures.run_mains_on_mock_data: each launch would import TensorFlow), then
averages the first's 2 checkpoints (a checkpoint each step for it; the others save
at the end) and evaluates it on its TFDS test split (the Translator's search on a
mixed_bfloat16 model); `make test-recipes` runs the whole chain for all four at that
width and at the recipes' own base and big sizes (tens of minutes on a CPU), each
binary in a process of its own (tests/tfds_fixtures.py runs its main per recipe).
"""

import os

import pytest
from tfds_fixtures import REPO_ROOT, binary_env, run_binary, run_mains_on_mock_data

pytestmark = pytest.mark.slow

RECIPES = ["wmt14_en_de_base", "wmt14_en_de_big", "wmt14_en_fr_base", "wmt14_en_fr_big"]
MOCK_EXAMPLES = 16
# make test: 4 examples a split, enough for 4 test sentences; the dev loss then reads one
# batch (one trace of its function per recipe).
MOCK_EXAMPLES_HERE = 4
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


def _train(dirs, vocab, overrides, dev_bleu_all=True, run=_run, every_step_all=True):
    """Trains the four recipes; dev BLEU for the first only unless `dev_bleu_all`, a
    checkpoint every step for the first only unless `every_step_all`."""
    trained = run("tf_transformer.train", [
        [f"--flagfile={os.path.join(REPO_ROOT, 'tf_transformer', 'recipes', r + '.flags')}",
         f"--vocab={vocab}", f"--model_dir={dirs[r]}", *overrides,
         *(EVERY_STEP if every_step_all or i == 0 else []),
         *(DEV_BLEU if dev_bleu_all or i == 0 else ["--dev_bleu_sentences=0"])]
        for i, r in enumerate(RECIPES)], timeout=3600)
    lines = trained.splitlines()
    done = [line for line in lines if line.startswith("done ")]
    assert len(done) == 4 and all("step=2 " in d and "stopped_by=max_steps" in d
                                  for d in done), done
    evals = [line for line in lines if line.startswith("eval step=2 ")]
    assert len(evals) == 4 and all("dev_loss=" in e for e in evals), evals
    assert all("dev_bleu=" in e for e in (evals if dev_bleu_all else evals[:1])), evals


def test_recipes_train_on_mock_data_then_average_and_evaluate(tmp_path, spm_model_path):
    """Each recipe's flags, data specs (a TFDS stream; dev from the validation split) and
    mixed_bfloat16 training, 2 steps at a tiny width; the first recipe's 2 checkpoints
    averaged and evaluated on its TFDS test split."""
    dirs = {r: str(tmp_path / r) for r in RECIPES}
    _train(dirs, spm_model_path, SIZES + TINY, dev_bleu_all=False, run=_run_here,
           every_step_all=False)
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
