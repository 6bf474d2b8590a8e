"""Train T5 for translation with FlexDeMo; with no data arguments, English -> French number words.

    accelerate launch --config_file accelerate_configs/cpu_2x2.yaml recipes/t5_translation.py
    torchrun --nproc_per_node 4 recipes/t5_translation.py --data_preset opus_books_en_fr --config_name t5-small

Arguments: ``python recipes/t5_translation.py --help``; data sources: ``hf_flexdemo.seq2seq.data``.
"""

from seq2seq import cli

if __name__ == "__main__":
    cli("translation")
