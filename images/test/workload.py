"""A scriptable workload for the runtime tests; one action per argument, run in order.

print:TEXT        print a line              env:NAME             print NAME=value
sleep:SECONDS     sleep                     exit:CODE            exit with CODE
write:FILE:TEXT   write a file in the data dir
count:FILE        append a line to FILE in the data dir (counts (re)starts)
metrics:L=V,...   report metrics over the bridge
announce:FILE:N   announce FILE (in the data dir) with N work units
raw:JSON          send one raw line over the bridge socket and print the reply
"""

import json
import os
import socket
import sys
import time

from workloads import bridge_client


def data(name: str) -> str:
    return os.path.join(os.environ["INTELLECT_DATA_DIR"], name)


def main(actions: list[str]) -> int:
    for action in actions:
        verb, _, arg = action.partition(":")
        if verb == "print":
            print(arg, flush=True)
        elif verb == "env":
            print(f"{arg}={os.environ.get(arg, '<unset>')}", flush=True)
        elif verb == "sleep":
            time.sleep(float(arg))
        elif verb == "exit":
            return int(arg)
        elif verb == "write":
            name, _, text = arg.partition(":")
            with open(data(name), "w") as handle:
                handle.write(text)
        elif verb == "count":
            with open(data(arg), "a") as handle:
                handle.write("start\n")
        elif verb == "metrics":
            pairs = (item.split("=", 1) for item in arg.split(","))
            bridge_client.report_metrics({k: float(v) for k, v in pairs})
            print("metrics sent", flush=True)
        elif verb == "announce":
            name, _, units = arg.partition(":")
            bridge_client.announce_file(data(name), work_units=int(units or 0))
            print(f"announced {name}", flush=True)
        elif verb == "raw":
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(os.environ["INTELLECT_SOCKET_PATH"])
                sock.sendall(arg.encode() + b"\n")
                print("reply " + json.dumps(json.loads(sock.makefile().readline())), flush=True)
        else:
            print(f"unknown action {action!r}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
