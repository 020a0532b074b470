"""c128patch stand-in for sglang.srt.server_args: ``ServerArgs.add_cli_args`` on an argparse parser,
with a few of upstream's options (upstream's real parser is built by doctor on a real install)."""

import argparse


class ServerArgs:
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--model-path", "--model", type=str, required=True)
        parser.add_argument("--tp-size", "--tp", type=int, default=1)
        parser.add_argument("--speculative-algorithm", type=str, choices=["EAGLE", "EAGLE3", "DSPARK", "NGRAM"])
        parser.add_argument("--enable-two-batch-overlap", action="store_true")
