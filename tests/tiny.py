"""Kept so that code importing ``tests.tiny`` goes on working; the helpers live in :mod:`tests.helpers`."""

from tests.helpers import CHAT_TEMPLATE, SPECIALS, char_tokenizer, tiny_llama, tiny_target

__all__ = ["CHAT_TEMPLATE", "SPECIALS", "char_tokenizer", "tiny_llama", "tiny_target"]
