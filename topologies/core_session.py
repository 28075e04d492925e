"""The thin gRPC shell to a CORE daemon, run by CORE's own Python (its venv holds CORE's
client and gRPC at the versions CORE pins; c2dtn's does not), so it imports nothing of c2dtn.

    <core venv>/bin/python core_session.py ADDRESS COMMAND < request.json > answer.json

COMMAND is one of:
  create  answer: {"session": id} (a new, empty session: its id is recorded before the build)
  build   request: a plan of topologies/core_plan.session_plan and its "session"; builds and
          starts it, then puts each direction's link options on its sending interface; a
          failure deletes the session; answer: {"session": id, "dir": its folder}
  edit    request: {"session", "node1", "node2", "iface1", "iface2", "options"}: one
          direction's link options (node1's interface sends)
  delete  request: {"session"}: stops the session and removes all it made
  ping    answer: {"sessions": [ids]}
Errors: exit 1 and {"error": "..."} on stdout.
"""

import json
import sys


def main() -> int:
    from core.api.grpc import client
    from core.api.grpc.wrappers import Interface, Link, LinkOptions

    address, command = sys.argv[1], sys.argv[2]
    req = json.load(sys.stdin) if command != "ping" else {}
    core = client.CoreGrpcClient(address)
    core.connect()
    try:
        if command == "ping":
            return _answer({"sessions": [s.id for s in core.get_sessions()]})
        if command == "delete":
            return _answer({"ok": core.delete_session(int(req["session"]))})
        if command == "edit":
            opts = LinkOptions(**req["options"])
            link = Link(
                node1_id=req["node1"],
                node2_id=req["node2"],
                iface1=Interface(id=req["iface1"]),
                iface2=Interface(id=req["iface2"]),
                options=opts,
            )
            return _answer({"ok": core.edit_link(int(req["session"]), link)})
        if command == "create":
            return _answer({"session": core.create_session().id})
        if command != "build":
            return _answer({"error": f"unknown command {command!r}"}, 1)
        session = core.get_session(int(req["session"]))
        try:
            return _build(core, session, req)
        except Exception:
            core.delete_session(session.id)
            raise
    except Refused as e:
        return _answer({"error": str(e)}, 1)
    except Exception as e:  # a gRPC or CORE error: answered as one line, not a traceback
        return _answer({"error": f"{type(e).__name__}: {e}"}, 1)
    finally:
        core.close()


class Refused(Exception):
    pass


def _build(core, session, req) -> int:
    from core.api.grpc.wrappers import Interface, Link, LinkOptions, NodeType, Position, Server

    session.servers = [Server(name=s["name"], host=s["host"]) for s in req["servers"]]
    nodes = {}
    for n in req["nodes"]:
        kind = NodeType.SWITCH if n["type"] == "SWITCH" else NodeType.DEFAULT
        nodes[n["name"]] = session.add_node(
            n["id"],
            name=n["name"],
            _type=kind,
            model="" if kind == NodeType.DEFAULT else None,  # no model: no services, no default route
            position=Position(x=n["x"], y=n["y"]),
            server=n["server"],
        )
    for l in req["links"]:
        session.add_link(
            node1=nodes[l["node1"]],
            node2=nodes[l["node2"]],
            iface1=Interface(**l["iface1"]),
            iface2=Interface(**l["iface2"]),
        )
    ok, errors = core.start_session(session)
    if not ok:
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        raise Refused("CORE did not start the session: " + "; ".join(errors[:3]) + more)
    for l in req["links"]:
        for opts, i1, i2, n1, n2 in (
            (l.get("options_ab"), l["iface1"], l["iface2"], l["node1"], l["node2"]),
            (l.get("options_ba"), l["iface2"], l["iface1"], l["node2"], l["node1"]),
        ):
            if opts:
                link = Link(
                    node1_id=nodes[n1].id,
                    node2_id=nodes[n2].id,
                    iface1=Interface(id=i1["id"]),
                    iface2=Interface(id=i2["id"]),
                    options=LinkOptions(**opts),
                )
                core.edit_link(session.id, link)
    return _answer({"session": session.id, "dir": core.get_session(session.id).dir})


def _answer(d, rc=0):
    json.dump(d, sys.stdout)
    return rc


if __name__ == "__main__":
    sys.exit(main())
