"""VM runtime: `type: vm` workloads as libvirt/QEMU domains booting registered images with cloud-init."""
