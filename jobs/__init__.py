"""Thin entrypoints: parse -> build -> run -> summarise. Each module has ``main(argv) -> int``."""
