"""persysctl exec and cp: inside a running workload, through the gateway and the node's agent."""

from __future__ import annotations

import base64
import os
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import IO

import typer

from persys.cli.ctl import terminal_client
from persys.cli.ctl.api import Api, ServerOpt, err_console, fail
from persys.model.copy_archive import (
    CopyError,
    landing,
    member_of,
    member_problems,
    parse_cp_args,
    renamed,
    top_entry,
)
from persys.model.limits import (
    COPY_MAX_BYTES,
    EXEC_OUTPUT_MAX_BYTES,
    EXEC_STDIN_MAX_BYTES,
    EXEC_TIMEOUT_SECONDS,
    human_bytes,
)

TIMED_OUT_EXIT = 124  # what timeout(1) exits with


def _paragraphs(text: str) -> str:
    """Help text with each paragraph on one line (the help formatter wraps them itself)."""
    return "\n\n".join(" ".join(p.split("\n")) for p in text.split("\n\n"))


EXEC_HELP = """Run a command in a running workload and pass its output and exit code through.

The command follows `--` and runs as given, not through a shell (add `sh -c '...'` for one):

  persysctl exec hello-docker -- cat /etc/hostname

  persysctl exec web --instance web.1 -- ls -l /data

  persysctl exec app --service db -- pg_isready      (compose: --service when there are several)

  echo 'SELECT 1;' | persysctl exec -i db -- psql    (-i: what persysctl reads is the command's input)

  persysctl exec -it web -- sh                       (-t: on a terminal, interactive, until it exits)

container: `docker exec` in the instance's container. compose: in the container of --service.
process: runs on the node in the process workload's own environment (its env, secret env included,
its working directory, its user, inside its cgroups): it is NOT an isolated container. VMs and
microVMs take no exec (their serial console is `persysctl console NAME`).

With -i, persysctl reads its standard input to the end first (at most 1 MiB; `persysctl cp` moves
files) and the command gets it, then end of input. stdout and stderr come back when the command
ends, at most 4 MiB together (the rest is cut, and a line says so). persysctl exits with the
command's exit code; with 124 when --timeout killed it.

With -t the command runs on a terminal (a TTY) and the session is live: keys go to it as typed
(persysctl's own terminal is in raw mode meanwhile, so ^C goes to the command too), output comes
as written, window size changes follow, and it lasts until the command exits (no --timeout;
leaving kills the command). Piped input with -t is typed in as it comes, then ^D.
Needs `exec workloads` (operators, admins); every exec is in the audit log with its command line."""
EXEC_HELP = _paragraphs(EXEC_HELP)

CP_HELP = """Copy a file or folder out of a container workload, or into it (as a tar archive, at most 64 MiB).

  persysctl cp hello-docker:/etc/hostname ./hostname

  persysctl cp ./site hello-docker:/srv/          (into an existing folder: /srv/site)

  persysctl cp ./index.html hello-docker:/srv/new.html

As with `docker cp`, a destination that is an existing folder receives the copy inside it; any other
destination is the copy's new name (its folder must exist). A local path containing ':' is written
./a:b. Container workloads only. Needs `cp workloads` (operators, admins); audited."""
CP_HELP = _paragraphs(CP_HELP)


def exec_command(
    name: str = typer.Argument(..., help="Workload name."),
    command: list[str] = typer.Argument(..., help="The command and its arguments, after --."),
    instance: str = typer.Option("", "--instance", help="Replica instance (default: the first), e.g. web.1."),
    service: str = typer.Option("", "--service", help="Compose: the service whose container runs it."),
    timeout: int = typer.Option(EXEC_TIMEOUT_SECONDS, "--timeout", min=1, max=3600,
                                help="Seconds before the command is killed (exit code 124)."),
    stdin: bool = typer.Option(False, "--stdin", "-i", help="Pass persysctl's standard input to the command "
                               "(read to its end first; at most 1 MiB)."),
    tty: bool = typer.Option(False, "--tty", "-t", help="Run it on a terminal, interactively, until it exits "
                             "(-it as with docker and kubectl; -i is implied)."),
    server: str | None = ServerOpt,
) -> None:
    if tty:
        cols, rows = terminal_client.window_size()
        params = [("command", c) for c in command] + [(k, v) for k, v in (
            ("instance", instance), ("service", service), ("cols", str(cols)), ("rows", str(rows))) if v and v != "0"]
        raise typer.Exit(terminal_client.run(Api(server), terminal_client.Session(
            f"/v1/workloads/{name}/terminal", params, console=False)))
    body = {"command": command, "instance": instance, "service": service, "timeout": timeout}
    if stdin:
        data = sys.stdin.buffer.read(EXEC_STDIN_MAX_BYTES + 1)
        if len(data) > EXEC_STDIN_MAX_BYTES:
            fail(f"-i: the input is over {human_bytes(EXEC_STDIN_MAX_BYTES)} (persysctl cp copies files in)")
        body["stdin"] = base64.b64encode(data).decode()
    r = Api(server).request("POST", f"/v1/workloads/{name}/exec", timeout=timeout + 45, json=body)
    sys.stdout.flush()
    sys.stdout.buffer.write(base64.b64decode(r["stdout"]))
    sys.stdout.buffer.flush()
    sys.stderr.buffer.write(base64.b64decode(r["stderr"]))
    sys.stderr.buffer.flush()
    if r["truncated"]:
        err_console.print(f"persysctl: output cut at {human_bytes(EXEC_OUTPUT_MAX_BYTES)} (the command ran on)",
                          markup=False, highlight=False)
    if r["timedOut"]:
        err_console.print(f"persysctl: {command[0]} was killed after --timeout {timeout}s", markup=False,
                          highlight=False)
        raise typer.Exit(TIMED_OUT_EXIT)
    raise typer.Exit(int(r["exitCode"]))


CONSOLE_HELP = """Attach to the serial console of a VM or microVM: what the guest writes, and your keys to it.

  persysctl console my-vm                            (Ctrl-] leaves; the VM runs on)

  printf 'uname -a\\n' | persysctl console my-vm      (typed in; leaves once the output is quiet)

One client at a time per VM (a second is refused while one is attached). On a terminal, persysctl's
own is in raw mode meanwhile: every key, ^C included, goes to the guest. What the console printed
before you attached, and while nobody was, is `persysctl logs NAME`. Needs `exec workloads`
(operators, admins); every attachment is in the audit log (never what was typed)."""
CONSOLE_HELP = _paragraphs(CONSOLE_HELP)


def console_command(
    name: str = typer.Argument(..., help="Workload name (a vm or microvm)."),
    instance: str = typer.Option("", "--instance", help="Replica instance (default: the first), e.g. vm.1."),
    linger: float = typer.Option(2.0, "--linger", min=0.1, max=600,
                                 help="Piped input: seconds of quiet output after its end before leaving."),
    server: str | None = ServerOpt,
) -> None:
    params = [("instance", instance)] if instance else []
    raise typer.Exit(terminal_client.run(Api(server), terminal_client.Session(
        f"/v1/workloads/{name}/console", params, console=True, linger=linger)))


def cp_command(
    src: str = typer.Argument(..., help="NAME:/path or a local path."),
    dst: str = typer.Argument(..., help="A local path or NAME:/path."),
    instance: str = typer.Option("", "--instance", help="Replica instance (default: the first), e.g. web.1."),
    server: str | None = ServerOpt,
) -> None:
    try:
        args = parse_cp_args(src, dst)
    except CopyError as err:
        fail(str(err))
    api = Api(server)
    params = {"path": args.remote, "instance": instance}
    with tempfile.TemporaryFile() as spool:
        if args.upload:
            _pack(Path(args.local), spool)
            spool.seek(0)
            api.request("PUT", f"/v1/workloads/{args.name}/files", params=params, content=spool, timeout=600,
                        headers={"content-type": "application/x-tar"})
            return
        api.download(f"/v1/workloads/{args.name}/files", spool, COPY_MAX_BYTES + 1024 * 1024, params=params,
                     timeout=600)
        spool.seek(0)
        try:
            _unpack(spool, Path(args.local))
        except (CopyError, tarfile.TarError, OSError) as err:
            fail(f"cannot write {args.local}: {err}")


def _pack(local: Path, spool: IO[bytes]) -> None:
    if not local.exists():
        fail(f"{local}: no such file or folder")
    top = local.resolve().name or "root"
    with tarfile.open(fileobj=spool, mode="w|") as tar:
        tar.add(str(local), arcname=top)
    size = spool.tell()
    if size > COPY_MAX_BYTES:
        fail(f"{local} is {human_bytes(size)} as a tar archive: over the copy limit of {human_bytes(COPY_MAX_BYTES)}")


def _unpack(spool: IO[bytes], local: Path) -> None:
    """Unpack the archive at `local`: into it when it is a folder, else as it (as `docker cp`).
    Every member is checked first (copy_archive.member_problems: nothing absolute, no '..', no
    link leading out, no device or FIFO, bounded sizes), whatever this Python's tarfile filters;
    tar's data filter then applies too where this Python has it."""
    with tarfile.open(fileobj=spool, mode="r:") as tar:
        members = tar.getmembers()
        problems = member_problems([member_of(m) for m in members], COPY_MAX_BYTES)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise CopyError(f"the archive from the workload is refused: {problems[0]}{more}")
        top = top_entry(m.name for m in members)
        folder, name = landing(str(local), local.is_dir(), top)
        if not os.path.isdir(folder):
            raise CopyError(f"no folder {folder}")
        for m in members:
            m.name = renamed(m.name, top, name)
            if m.islnk():
                m.linkname = renamed(m.linkname, top, name)
            m.mode &= 0o777  # never setuid, setgid or sticky
            if hasattr(tarfile, "data_filter"):
                tar.extract(m, folder, filter="data")
            else:  # checked above; this Python has no filters
                tar.extract(m, folder)
