"""Training: the loop (train), its batches and each task's sequences (batches), criterion
stopping (stopping), the position learning-rate sweep (tune) and fine-tuning (finetune)."""
