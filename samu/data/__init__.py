"""Training data: the embedded stdlib corpus, the user's text files and pre-tokenized token files."""

from samu.data.corpus import (DATA_FORMATS, TokenData, cache_dir, load_data, stdlib_cached, stdlib_corpus,
                              stdlib_files, text_corpus, token_file)

__all__ = ["TokenData", "load_data", "stdlib_corpus", "stdlib_cached", "stdlib_files", "text_corpus",
           "token_file", "cache_dir", "DATA_FORMATS"]
