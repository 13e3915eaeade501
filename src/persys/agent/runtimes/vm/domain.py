"""libvirt domain XML of a persys VM (pure): the definition, the `<persys:workload>` metadata
that lets a restarted agent recognise and adopt its domains, and the per-node domain name."""

from __future__ import annotations

import hashlib
import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

NS = "https://persys.dev/xmlns/libvirt-vm/v1"
NAME_PREFIX = "persys-"

ET.register_namespace("persys", NS)


@dataclass
class DomainMeta:
    workload_id: str
    revision: str
    generation: int
    started_at: float
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DataDisk:
    """A volume attached as a virtio disk (vdb, vdc, ...): a file on the node, or a network disk
    QEMU opens itself (rbd through librbd with a libvirt secret holding the cephx key; nfs through
    libnfs)."""

    protocol: str  # file | rbd | nfs
    source: str  # path, "pool/image", or "/export/path/file" (nfs)
    hosts: tuple[tuple[str, int], ...] = ()  # (name, port); port 0: none given (nfs)
    read_only: bool = False
    auth_user: str = ""  # rbd: cephx user
    secret_uuid: str = ""  # rbd: the libvirt secret holding its key
    # nfs: the uid and gid QEMU presents to the server (AUTH_SYS): the owner of the volume's image
    # (mode 0600), which QEMU's own user is not.
    identity: tuple[int, int] | None = None


@dataclass(frozen=True)
class DomainConfig:
    name: str
    domain_type: Literal["kvm", "qemu"]
    vcpus: int
    memory_mb: int
    disk: Path
    console_log: Path
    meta: DomainMeta
    uuid: str = ""
    seed: Path | None = None
    kernel: str = ""
    initrd: str = ""
    cmdline: str = ""
    networks: tuple[str, ...] = ()
    data_disks: tuple[DataDisk, ...] = ()


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrib: str) -> ET.Element:
    el = ET.SubElement(parent, tag, attrib)
    if text is not None:
        el.text = text
    return el


def _interface(devices: ET.Element, net: str) -> None:
    if net == "user":
        iface = _sub(devices, "interface", type="user")  # QEMU's own NAT: no bridge, no firewall rules
    elif net.startswith("bridge:"):
        iface = _sub(devices, "interface", type="bridge")
        _sub(iface, "source", bridge=net.removeprefix("bridge:"))
    else:
        iface = _sub(devices, "interface", type="network")
        _sub(iface, "source", network=net.removeprefix("network:"))
    _sub(iface, "model", type="virtio")


def _data_disk(devices: ET.Element, d: DataDisk, dev: str) -> None:
    if d.protocol == "file":
        disk = _sub(devices, "disk", type="file", device="disk")
        _sub(disk, "driver", name="qemu", type="raw", cache="none", io="native")
        _sub(disk, "source", file=d.source)
    else:
        disk = _sub(devices, "disk", type="network", device="disk")
        _sub(disk, "driver", name="qemu", type="raw", cache="none" if d.protocol == "rbd" else "default")
        src = _sub(disk, "source", protocol=d.protocol, name=d.source)
        for host, port in d.hosts:
            if port:
                _sub(src, "host", name=host, port=str(port))
            else:
                _sub(src, "host", name=host)
        if d.identity is not None:
            _sub(src, "identity", user=f"+{d.identity[0]}", group=f"+{d.identity[1]}")
        if d.auth_user:
            auth = _sub(disk, "auth", username=d.auth_user)
            _sub(auth, "secret", type="ceph", uuid=d.secret_uuid)
    _sub(disk, "target", dev=dev, bus="virtio")
    if d.read_only:
        _sub(disk, "readonly")


def domain_xml(cfg: DomainConfig) -> str:
    dom = ET.Element("domain", type=cfg.domain_type)
    _sub(dom, "name", cfg.name)
    if cfg.uuid:
        _sub(dom, "uuid", cfg.uuid)  # redefining an existing name must keep its uuid
    md = ET.SubElement(_sub(dom, "metadata"), f"{{{NS}}}workload")
    _sub(md, f"{{{NS}}}id", cfg.meta.workload_id)
    _sub(md, f"{{{NS}}}revision", cfg.meta.revision)
    _sub(md, f"{{{NS}}}generation", str(cfg.meta.generation))
    _sub(md, f"{{{NS}}}startedAt", f"{cfg.meta.started_at:.3f}")
    for k, v in sorted(cfg.meta.labels.items()):
        _sub(md, f"{{{NS}}}label", key=k, value=v)
    _sub(dom, "memory", str(cfg.memory_mb), unit="MiB")
    _sub(dom, "currentMemory", str(cfg.memory_mb), unit="MiB")
    _sub(dom, "vcpu", str(cfg.vcpus), placement="static")
    os_el = _sub(dom, "os")
    # i440fx: the only x86 machine with an IDE bus, which is where NoCloud seeds conventionally go.
    _sub(os_el, "type", "hvm", arch="x86_64", machine="pc")
    if cfg.kernel:
        _sub(os_el, "kernel", cfg.kernel)
        if cfg.initrd:
            _sub(os_el, "initrd", cfg.initrd)
        cmdline = cfg.cmdline
        if "console=" not in cmdline:
            cmdline = f"{cmdline} console=ttyS0".strip()  # logs() reads the serial console
        _sub(os_el, "cmdline", cmdline)
    else:
        _sub(os_el, "boot", dev="hd")
    features = _sub(dom, "features")
    _sub(features, "acpi")  # shutdown() presses the ACPI power button
    _sub(features, "apic")
    _sub(dom, "on_poweroff", "destroy")
    _sub(dom, "on_reboot", "restart")
    _sub(dom, "on_crash", "destroy")  # a crashed guest is a failed workload; the agent's policy restarts it
    devices = _sub(dom, "devices")
    disk = _sub(devices, "disk", type="file", device="disk")
    _sub(disk, "driver", name="qemu", type="qcow2", discard="unmap")
    _sub(disk, "source", file=str(cfg.disk))
    _sub(disk, "target", dev="vda", bus="virtio")
    for i, d in enumerate(cfg.data_disks):  # volumes: vdb, vdc, ... in the order the spec lists them
        _data_disk(devices, d, "vd" + chr(ord("b") + i))
    if cfg.seed is not None:
        cd = _sub(devices, "disk", type="file", device="cdrom")
        _sub(cd, "driver", name="qemu", type="raw")
        _sub(cd, "source", file=str(cfg.seed))
        _sub(cd, "target", dev="hdc", bus="ide")
        _sub(cd, "readonly")
    for net in cfg.networks:
        _interface(devices, net)
    if cfg.networks:
        # Lets `inspect` ask a guest agent for addresses that no DHCP lease table knows.
        chan = _sub(devices, "channel", type="unix")
        _sub(chan, "target", type="virtio", name="org.qemu.guest_agent.0")
    # The serial port is a pty that `persysctl console` attaches to (libvirt's console API), and
    # everything the guest writes to it is also logged to a file, appending across restarts (what
    # `logs` reads). The console is the same port.
    # No <graphics>: none is the default, and `<graphics type='none'/>` is not valid XML for libvirt.
    serial = _sub(devices, "serial", type="pty")
    _sub(serial, "log", file=str(cfg.console_log), append="on")
    _sub(serial, "target", port="0")
    console = _sub(devices, "console", type="pty")
    _sub(console, "log", file=str(cfg.console_log), append="on")
    _sub(console, "target", type="serial", port="0")
    _sub(devices, "controller", type="usb", model="none")
    balloon = _sub(devices, "memballoon", model="virtio")
    _sub(balloon, "stats", period="5")  # guest-side memory figures when the guest has the driver
    rng = _sub(devices, "rng", model="virtio")
    _sub(rng, "backend", "/dev/urandom", model="random")  # cloud images block on entropy otherwise
    return ET.tostring(dom, encoding="unicode")


def parse_meta(xml_desc: str) -> DomainMeta | None:
    """The persys metadata of a domain's XML, or None for domains persys does not manage."""
    try:
        root = ET.fromstring(xml_desc)
    except ET.ParseError:
        return None
    el = root.find(f"metadata/{{{NS}}}workload")
    if el is None:
        return None
    wid = el.findtext(f"{{{NS}}}id") or ""
    if not wid:
        return None
    try:
        generation = int(el.findtext(f"{{{NS}}}generation") or 0)
        started_at = float(el.findtext(f"{{{NS}}}startedAt") or 0)
    except ValueError:
        generation, started_at = 0, 0.0
    labels = {lab.get("key", ""): lab.get("value", "") for lab in el.findall(f"{{{NS}}}label")}
    return DomainMeta(wid, el.findtext(f"{{{NS}}}revision") or "", generation, started_at, labels)


def domain_name(workload_id: str, scope: Mapping[str, str]) -> str:
    """`persys-<id>`, plus a hash of the node scope when there is one, so agents of several nodes
    on one host (dev clusters, tests) never collide on a name or touch each other's domains."""
    if not scope:
        return f"{NAME_PREFIX}{workload_id}"
    digest = hashlib.sha256(json.dumps(sorted(scope.items())).encode()).hexdigest()[:8]
    return f"{NAME_PREFIX}{digest}-{workload_id}"
