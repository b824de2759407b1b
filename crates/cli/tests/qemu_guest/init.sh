#!/bin/busybox sh
# /init of the tests' guest (tests/qemu_guest.rs). What it does is chosen by
# trireme.mode= on the kernel command line; every line the test waits for
# starts with "TRIREME " on the serial console. Modes: write, verify, both
# (the tests'), boot (mount and power off: a boot's time), fio
# (bench/guest.sh: fio from the second disk, on the first one's device).
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for module in $(cat /modules/order); do insmod /modules/$module; done
mode=$(sed -n 's/.*trireme\.mode=\([a-z]*\).*/\1/p' /proc/cmdline)
count=$(sed -n 's/.*trireme\.count=\([0-9]*\).*/\1/p' /proc/cmdline)
say() { echo "TRIREME $*"; }
end() { sync; poweroff -f; }
i=0
while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
mount -t ext4 /dev/vda /mnt || { say "MOUNT-FAILED"; end; }
say "BOOTED mode=$mode"
cd /mnt
# Each file is random data, synced, and only then its checksum appended to
# sums and synced: a line in sums names a file that was already durable.
write() {
    n=$(ls f.* 2>/dev/null | wc -l)
    last=$((n + count))
    while [ $n -lt $last ]; do
        n=$((n + 1))
        dd if=/dev/urandom of=f.$n bs=64k count=4 2>/dev/null || { say "IO-ERROR write f.$n"; return; }
        sync f.$n || { say "IO-ERROR sync f.$n"; return; }
        sha256sum f.$n >>sums && sync sums || { say "IO-ERROR sums f.$n"; return; }
        say "SYNCED $n"
    done
    say "WROTE $n"
}
verify() {
    touch sums
    lines=$(wc -l <sums)
    bad=$(sha256sum -c sums 2>&1 | grep -v ': OK$' | wc -l)
    say "VERIFIED lines=$lines bad=$bad"
    sha256sum -c sums 2>&1 | grep -v ': OK$' | head -n 5
}
# bench/guest.sh: fio and the libraries it needs come on a second disk
# (/dev/vdb, read-only); each job runs on the whole first disk's device,
# its JSON between "FIO-BEGIN name" and "FIO-END name" lines.
fio_jobs() {
    runtime=$(sed -n 's/.*trireme\.runtime=\([0-9]*\).*/\1/p' /proc/cmdline)
    size=$(sed -n 's/.*trireme\.size=\([0-9]*[KMG]\).*/\1/p' /proc/cmdline)
    mkdir -p /tools /tmp
    mount -t ext4 -o ro /dev/vdb /tools || { say "NO-TOOLS"; return; }
    fio() {
        /tools/lib/ld-linux-x86-64.so.2 --library-path /tools/lib /tools/bin/fio \
            --thread --filename=/dev/vda --ioengine=libaio --direct=1 --size="$size" \
            --randrepeat=0 --norandommap --group_reporting --output-format=json "$@"
    }
    run_job() {
        name=$1
        shift
        say "FIO-BEGIN $name"
        fio --name="$name" "$@"
        say "FIO-END $name rc=$?"
    }
    run_job prefill --rw=write --bs=1M --iodepth=8
    for job in randwrite randread fsync; do
        case $job in
            randwrite) args="--rw=randwrite --bs=4k --iodepth=32" ;;
            randread) args="--rw=randread --bs=4k --iodepth=32" ;;
            fsync) args="--rw=randwrite --bs=4k --iodepth=1 --fsync=1" ;;
        esac
        # shellcheck disable=SC2086
        run_job $job $args --runtime="$runtime" --ramp_time=1 --time_based
    done
    umount /tools
}
case "$mode" in
    write) write ;;
    verify) verify ;;
    both) verify; write ;;
    fio) cd /; umount /mnt && say "UNMOUNTED"; fio_jobs; end ;;
esac
cd /
umount /mnt && say "UNMOUNTED"
end
