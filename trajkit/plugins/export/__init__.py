"""The output writers, ``trajkit export`` and its formats (Hugging Face datasets, chat templates)."""
