"""VM runtime: `type: vm` workloads as libvirt/QEMU domains booting registered images with cloud-init."""

from persys.agent.runtimes.kvm import detect_accelerator, detect_accelerator_with_reason
from persys.agent.runtimes.vm.cloudinit import SeedError, build_seed
from persys.agent.runtimes.vm.domain import DomainConfig, DomainMeta, domain_name, domain_xml, parse_meta
from persys.agent.runtimes.vm.images import ImageError, ImageRecord, ImageRegistry
from persys.agent.runtimes.vm.runtime import LibvirtVMRuntime

__all__ = [
    "DomainConfig",
    "DomainMeta",
    "ImageError",
    "ImageRecord",
    "ImageRegistry",
    "LibvirtVMRuntime",
    "SeedError",
    "build_seed",
    "detect_accelerator",
    "detect_accelerator_with_reason",
    "domain_name",
    "domain_xml",
    "parse_meta",
]
