#!/usr/bin/env python3
"""Reference client of `treetrain serve` (Python standard library only): runs whole episodes of
the built-in navigation environment (`treetrain nav-env`, JSON lines over a pipe) through a policy
server (JSON lines over TCP) and prints the success rate and SPL as one JSON line, like
`treetrain eval --env nav` prints the model's for the same --seed and --episodes.

  treetrain serve --checkpoint runs/vla_quickstart --action-ids 8:12 &      # prints its port
  python3 scripts/nav_client.py --server 127.0.0.1:PORT --treetrain bazel-bin/trainer/treetrain \\
      --episodes 20 --seed 7777
"""
import argparse
import json
import socket
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True, help="HOST:PORT of treetrain serve")
    ap.add_argument("--treetrain", default="treetrain", help="the treetrain binary (for nav-env)")
    ap.add_argument("--episodes", type=int, default=50)
    ap.add_argument("--seed", type=int, default=7777)
    ap.add_argument("--action-base", type=int, default=8, help="token id of action 0 (stop)")
    ap.add_argument("--env-args", default="", help="extra nav-env flags, e.g. '--size 5'")
    a = ap.parse_args()

    host, port = a.server.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    server = sock.makefile("rw", encoding="utf-8", newline="\n")
    env = subprocess.Popen([a.treetrain, "nav-env"] + a.env_args.split(), stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)

    def ask(stream, msg, read):
        stream.write(json.dumps(msg) + "\n")
        stream.flush()
        reply = json.loads(read.readline())
        if "error" in reply:
            sys.exit(f"error from {'server' if stream is server else 'nav-env'}: {reply['error']}")
        return reply

    success = spl = 0.0
    for e in range(a.episodes):
        obs = ask(env.stdin, {"reset": {"seed": a.seed, "episode": e}}, env.stdout)
        session = f"episode-{e}"
        ask(server, {"session": session, "reset": True, "instruction": obs["instruction"]}, server)
        while not obs["done"]:
            act = ask(server, {"session": session, "images": [obs["image"]]}, server)
            obs = ask(env.stdin, {"step": act["action_ids"][0] - a.action_base}, env.stdout)
        ask(server, {"session": session, "close": True}, server)
        success += obs["success"]
        spl += obs["spl"]
    env.stdin.close()
    env.wait()
    print(json.dumps({"episodes": a.episodes, "seed": a.seed, "success": success / a.episodes,
                      "spl": spl / a.episodes}))


if __name__ == "__main__":
    main()
