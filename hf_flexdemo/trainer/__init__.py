"""The Hugging Face integration: ``FlexDeMoTrainer`` and ``FlexDeMoConfig``, checkpoints, logging and the model card
(the trainer modules need transformers and accelerate)."""
