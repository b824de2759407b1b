#!/bin/sh
# Assembles the small Linux guest of tests/qemu_guest.rs into OUT (a cache
# directory keyed by the kernel version): OUT/vmlinuz and OUT/initramfs.cpio.gz.
# The kernel is the Debian package KERNEL_PACKAGE (apt-get download, dpkg -x);
# the initramfs holds busybox (busybox-static), the modules the guest needs
# for its disk (virtio_pci, virtio_blk, ext4 and crc32c_generic, which ext4
# asks the crypto API for at mount time, and what they depend on, read
# from each module's own "depends=" since the package carries no
# modules.dep before depmod runs on install) and init.sh as /init.
# With TRIREME_BINARY (tests/kernel_nbd.rs) the guest is the kernel nbd
# one instead: the nbd and xfs modules too, that trireme binary, mkfs.ext4,
# e2fsck, resize2fs, mkfs.xfs, xfs_growfs, xfs_repair and
# qemu-storage-daemon, each with the shared libraries ldd lists; perl with
# the modules the Proxmox plugin and its tests load (perl_files.pl lists
# them) and the plugin (integrations/proxmox) as /proxmox; kernel_nbd.sh as
# /init, with proxmox.sh and bench.sh (its other scenarios) beside it.
# Usage: assemble.sh KERNEL_PACKAGE OUT [TRIREME_BINARY]
set -eu
package=$1
out=$2
trireme=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
work="$out.tmp.$$"
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
cd "$work"
apt-get download "$package" >download.log 2>&1 || {
    cat download.log >&2
    echo "assemble.sh: cannot download the kernel package $package (apt-get download)" >&2
    exit 2
}
dpkg -x ./*.deb kernel
version=$(ls kernel/lib/modules)
moddir=kernel/lib/modules/$version
root=root
mkdir -p $root/bin $root/proc $root/sys $root/dev $root/mnt $root/modules
cp "$(command -v busybox)" $root/bin/busybox
# Depth-first over "depends=", so that each module follows what it needs.
seen=" "
add() {
    local name file deps dep
    name=$(echo "$1" | tr - _)
    case "$seen" in *" $name "*) return ;; esac
    seen="$seen$name "
    file=$(find "$moddir" -name "$name.ko" -o -name "$(echo "$name" | tr _ -).ko" | head -n 1)
    if [ -z "$file" ]; then
        echo "assemble.sh: module $name not in $package" >&2
        exit 2
    fi
    deps=$(tr '\0' '\n' <"$file" | sed -n 's/^depends=//p' | head -n 1 | tr , ' ')
    for dep in $deps; do add "$dep"; done
    cp "$file" $root/modules/
    echo "$(basename "$file")" >>$root/modules/order
}
for module in virtio_pci virtio_blk crc32c_generic ext4; do add $module; done
init=init.sh
if [ -n "$trireme" ]; then
    add nbd
    add xfs
    init=kernel_nbd.sh
    # A binary and the libraries ldd names, at the same paths as here.
    copy_with_libraries() {
        local binary=$1 target=$2 library
        mkdir -p "$root$(dirname "$target")"
        cp "$binary" "$root$target"
        for library in $(ldd "$binary" | grep -o '/[^ ]*'); do
            mkdir -p "$root$(dirname "$library")"
            cp -L "$library" "$root$library"
        done
    }
    copy_with_libraries "$trireme" /bin/trireme
    # Line tables only matter on the host; a smaller initramfs boots faster.
    strip "$root/bin/trireme" 2>/dev/null || true
    copy_with_libraries "$(command -v mkfs.ext4)" /sbin/mkfs.ext4
    copy_with_libraries "$(command -v e2fsck)" /sbin/e2fsck
    copy_with_libraries "$(command -v resize2fs)" /sbin/resize2fs
    for tool in mkfs.xfs xfs_growfs xfs_repair; do
        copy_with_libraries "$(command -v $tool)" /sbin/$tool
    done
    mkdir -p $root/etc
    if [ -f /etc/mke2fs.conf ]; then cp /etc/mke2fs.conf $root/etc/; fi
    # "The VM" of the Proxmox scenario: QEMU's block layer holding the disk.
    copy_with_libraries "$(command -v qemu-storage-daemon)" /usr/bin/qemu-storage-daemon
    # The Proxmox plugin's real code, run by perl in the guest.
    plugin=$(cd "$here/../../../../integrations/proxmox" && pwd)
    copy_with_libraries "$(command -v perl)" /usr/bin/perl
    (cd "$plugin" && perl -I. -It/lib "$here/perl_files.pl") >perl.files
    grep '^/' perl.files | while read -r file; do
        mkdir -p "$root$(dirname "$file")"
        cp -L "$file" "$root$file"
    done
    mkdir -p $root/proxmox
    cp -R "$plugin/PVE" "$plugin/t" $root/proxmox/
    cp "$here/proxmox.sh" "$here/bench.sh" $root/
fi
cp "$here/$init" $root/init
chmod +x $root/init
(cd $root && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) >initramfs.cpio.gz
cp kernel/boot/vmlinuz-* vmlinuz
mkdir -p "$out"
mv vmlinuz initramfs.cpio.gz "$out/"
echo "$version" >"$out/version"
