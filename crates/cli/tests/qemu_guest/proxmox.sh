# Sourced by the kernel nbd guest's /init (kernel_nbd.sh) for
# trireme.scenario=proxmox (tests/kernel_nbd.rs): the guest stands in for a
# Proxmox VE host, whose kernel has the nbd module. A single-node trireme
# runs on the guest's disk, and the plugin's own Perl test of its kernel
# nbd path (integrations/proxmox/t/40-kernel-nbd.t, the plugin and its
# tests' stand-in for Proxmox's base class under /proxmox) runs against
# it with perl: a VM's disk as /dev/nbdN that grows while "the VM"
# (qemu-storage-daemon) holds it, and a container's ext4 root disk. Every
# TAP line goes to the console as "TRIREME TAP ..."; then "RESULT ok" or
# "RESULT fail: why".
export PATH=/usr/bin:$PATH
start_node
export TRIREME_TEST_NODES="guest=http://$api"
TRIREME_TEST_TOKEN=$(cat /data/trireme/admin.token) || fail "no admin token"
export TRIREME_TEST_TOKEN
export TRIREME_PVE_STATE_DIR=/tmp/pve
started=$(date +%s)
(cd /proxmox && perl -I . -I t/lib t/40-kernel-nbd.t) >/tmp/tap.log 2>&1
rc=$?
sed 's/^/TRIREME TAP /' /tmp/tap.log
plan=$(sed -n 's/^1\.\.\([0-9]*\).*/\1/p' /tmp/tap.log)
passed=$(grep -c '^ok ' /tmp/tap.log)
failed=$(grep -c '^not ok ' /tmp/tap.log)
say "PROVED plan=$plan passed=$passed failed=$failed rc=$rc in $(($(date +%s) - started)) s"
[ "$rc" = 0 ] && [ "$failed" = 0 ] && [ "${plan:-0}" -gt 0 ] && [ "$passed" = "$plan" ] ||
    fail "t/40-kernel-nbd.t: $passed of ${plan:-?} passed, $failed failed, perl exited $rc"
kill "$(cat /tmp/node.pid)"
say "RESULT ok"
