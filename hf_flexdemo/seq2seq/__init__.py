"""What the recipes share: the seq2seq data, model, metrics and the embedded number-words task (the ``recipes``
extra)."""
