"""Section 5: the loss, the schedule, the distributed trainer and its checkpoints,
and fine-tuning's start from a trained model (fine_tuning.py)."""
