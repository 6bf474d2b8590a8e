"""Train T5 for summarization with FlexDeMo, e.g. on the paper's WikiHow data.

    accelerate launch --config_file accelerate_configs/cpu_2x2.yaml recipes/t5_summarization.py --data_preset wikihow
    torchrun --nproc_per_node 4 recipes/t5_summarization.py --train_file articles.jsonl --text_column text

Arguments: ``python recipes/t5_summarization.py --help``; data sources: ``hf_flexdemo.seq2seq.data``.
"""

from seq2seq import cli

if __name__ == "__main__":
    cli("summarization")
