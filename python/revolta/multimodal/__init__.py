"""Media for vision-language models: decoding and preprocessing as the HF processors of the
Qwen-VL family do it (image.py)."""
