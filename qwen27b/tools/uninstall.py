"""`qwen27b uninstall INVENTORY --limit HOST [--weights] [--driver] [--chat-data] [--dry]`:
`pyinfra INVENTORY uninstall.py -y --limit HOST [--data qwen27b_uninstall_weights=true ...]`.

Removes what the deploy made, each removal listed in the plan first (--dry: the list only). The
weights, the NVIDIA driver and a chat page's users and chats stay unless --weights / --driver /
--chat-data. The deploy file (uninstall.py,
roles/uninstall.py) does the work.
"""

from __future__ import annotations

import sys

from qwen27b.tools.rollout import run_deploy_file


def _options(parser) -> None:
    parser.add_argument("--weights", action="store_true", help="remove the model weights too (20+ GiB)")
    parser.add_argument("--driver", action="store_true",
                        help="unhold and purge the NVIDIA driver packages, remove the nouveau blacklist")
    parser.add_argument("--chat-data", action="store_true",
                        help="remove a gateway's chat page users and chats too (/var/lib/qwen27b-chat)")


def main(argv: list[str] | None = None) -> int:
    return run_deploy_file("qwen27b uninstall", "uninstall.py", __doc__.split("\n\n")[1].replace("\n", " "),
                           list(sys.argv[1:] if argv is None else argv),
                           data=lambda args: {"qwen27b_uninstall_weights": str(args.weights).lower(),
                                              "qwen27b_uninstall_driver": str(args.driver).lower(),
                                              "qwen27b_uninstall_chat_data": str(args.chat_data).lower()},
                           extra_options=_options)


if __name__ == "__main__":
    sys.exit(main())
