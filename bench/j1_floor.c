// The fastest replicated J1 (a 4 KiB write, then a flush, one at a time)
// that a straightforward program reaches on this machine: the floor the
// three-replica J1 cycle is compared against (issue 24), with the real
// loopback hops, the real write + fdatasync of three copies on one disk,
// and the real wake-ups of four processes sharing this machine's CPUs,
// but none of trireme's work (no journal, checksums, map, NBD, Raft).
// Built and run by bench/replicated.sh; it prints "cycle_us N".
//
// Four processes, as in bench/replicated.sh's three-node cluster and its
// fio client: a client, a primary and two replicas, linked by loopback TCP
// (TCP_NODELAY, blocking calls, one thread each). Each node writes its copy
// with O_DIRECT at a random 4 KiB offset of its own preallocated file (as
// raw3 does) and makes it durable with fdatasync. With "buffered" the
// copies go through the page cache instead (the data then reaches the
// device inside fdatasync, after the acknowledgement): slower here, 728-958
// against 517-566 us per cycle in three alternating runs, so not the default.
//
// The shape is the best one we know, better than trireme's own: the client
// sends WRITE; the primary forwards it to both replicas, writes its copy,
// waits for both acknowledgements and answers; every node then flushes at
// once ("eagerly") without waiting for the FLUSH, and each replica reports
// SYNCED when its flush is done, so the client's FLUSH is answered as soon
// as the primary's own flush and both SYNCED are in, with no trip to the
// replicas and back. The cycle is then 4 hops (client -> primary ->
// replica, and back) around a replica's write + fdatasync, which is the
// chain bench/replicated.sh prints (raw3 + 4 hops), plus only what the
// machine adds: wake-ups and CPU shared by four processes.
//
// Usage: j1_floor DIR SECONDS [SIZE_MIB [buffered]]
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BLK 4096
#define HDR 64

enum kind { WRITE = 1, FLUSH = 2, ACK = 3, SYNCED = 4, STOP = 5 };

struct header {
    uint32_t kind;
    uint32_t pad;
    uint64_t seq;
    char rest[HDR - 16];
};

static void die(const char *what) {
    perror(what);
    exit(1);
}

static void read_all(int fd, void *buffer, size_t length) {
    char *at = buffer;
    while (length > 0) {
        ssize_t got = read(fd, at, length);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            die("read");
        at += got;
        length -= got;
    }
}

static void write_all(int fd, const void *buffer, size_t length) {
    const char *at = buffer;
    while (length > 0) {
        ssize_t put = write(fd, at, length);
        if (put < 0 && errno == EINTR)
            continue;
        if (put <= 0)
            die("write");
        at += put;
        length -= put;
    }
}

static void send_message(int fd, uint32_t kind, uint64_t seq, const char *data) {
    struct header h = {.kind = kind, .seq = seq};
    if (data) {
        struct iovec iov[2] = {{&h, HDR}, {(void *)data, BLK}};
        ssize_t put = writev(fd, iov, 2);
        if (put < 0)
            die("writev");
        if (put < HDR)
            write_all(fd, (char *)&h + put, HDR - put), put = HDR;
        if (put < HDR + BLK)
            write_all(fd, data + (put - HDR), HDR + BLK - put);
    } else {
        write_all(fd, &h, HDR);
    }
}

static struct header receive(int fd, char *data) {
    struct header h;
    read_all(fd, &h, HDR);
    if (h.kind == WRITE)
        read_all(fd, data, BLK);
    return h;
}

static int listen_on(uint16_t *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 4) < 0)
        die("listen");
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    *port = ntohs(a.sin_port);
    return fd;
}

static int nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static int accept_one(int listener) {
    int fd = accept(listener, NULL, NULL);
    if (fd < 0)
        die("accept");
    close(listener);
    return nodelay(fd);
}

static int connect_to(uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0)
        die("connect");
    return nodelay(fd);
}

struct copy {
    int fd;
    uint64_t blocks;
    uint64_t rng;
};

static int direct_io;

static struct copy open_copy(const char *dir, const char *name, uint64_t bytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDWR | O_CREAT | (direct_io ? O_DIRECT : 0), 0600);
    if (fd < 0)
        die(path);
    // Preallocated and written once, as raw3's files are after fio lays
    // them out: the measured writes overwrite written blocks.
    if (fallocate(fd, 0, 0, bytes) < 0)
        die("fallocate");
    char *zero = aligned_alloc(BLK, 1 << 20);
    memset(zero, 0, 1 << 20);
    for (uint64_t at = 0; at < bytes; at += 1 << 20)
        if (pwrite(fd, zero, 1 << 20, at) != 1 << 20)
            die("prefill");
    if (fdatasync(fd) < 0)
        die("fdatasync");
    free(zero);
    return (struct copy){.fd = fd, .blocks = bytes / BLK, .rng = (uint64_t)fd * 0x9e3779b97f4a7c15ull};
}

static void write_copy(struct copy *c, const char *data) {
    c->rng ^= c->rng << 13, c->rng ^= c->rng >> 7, c->rng ^= c->rng << 17;
    if (pwrite(c->fd, data, BLK, (c->rng % c->blocks) * BLK) != BLK)
        die("pwrite");
}

static void sync_copy(struct copy *c) {
    if (fdatasync(c->fd) < 0)
        die("fdatasync");
}

// A replica: write, acknowledge, flush at once, report SYNCED.
static void replica(int link, struct copy c) {
    char *data = aligned_alloc(BLK, BLK);
    for (;;) {
        struct header h = receive(link, data);
        if (h.kind == STOP)
            exit(0);
        write_copy(&c, data);
        send_message(link, ACK, h.seq, NULL);
        sync_copy(&c);
        send_message(link, SYNCED, h.seq, NULL);
    }
}

// The primary: forward, write its copy, answer once both replicas have
// it; flush at once; answer a FLUSH once its own flush and both SYNCED are
// in. Messages from a replica arrive in order (ACK before SYNCED).
static void primary(int client, int r1, int r2, struct copy c) {
    char *data = aligned_alloc(BLK, BLK);
    char scratch[BLK];
    for (;;) {
        struct header h = receive(client, data);
        if (h.kind == STOP) {
            send_message(r1, STOP, 0, NULL);
            send_message(r2, STOP, 0, NULL);
            exit(0);
        }
        if (h.kind != WRITE) {
            fprintf(stderr, "primary: expected a write\n");
            exit(1);
        }
        send_message(r1, WRITE, h.seq, data);
        send_message(r2, WRITE, h.seq, data);
        write_copy(&c, data);
        receive(r1, scratch);
        receive(r2, scratch);
        send_message(client, ACK, h.seq, NULL);
        sync_copy(&c);
        struct header flush = receive(client, data);
        if (flush.kind != FLUSH) {
            fprintf(stderr, "primary: expected a flush\n");
            exit(1);
        }
        receive(r1, scratch);
        receive(r2, scratch);
        send_message(client, ACK, flush.seq, NULL);
    }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s DIR SECONDS [SIZE_MIB [buffered]]\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    double seconds = atof(argv[2]);
    if (seconds <= 0) {
        fprintf(stderr, "SECONDS must be a positive number, not '%s'\n", argv[2]);
        return 2;
    }
    uint64_t bytes = (argc > 3 ? strtoull(argv[3], NULL, 10) : 1024) << 20;
    direct_io = !(argc > 4 && strcmp(argv[4], "buffered") == 0);
    uint16_t p_port, r1_port, r2_port;
    int p_listen = listen_on(&p_port), r1_listen = listen_on(&r1_port),
        r2_listen = listen_on(&r2_port);
    struct copy copies[3] = {open_copy(dir, "floor.0.img", bytes), open_copy(dir, "floor.1.img", bytes),
                             open_copy(dir, "floor.2.img", bytes)};
    pid_t pids[3];
    if ((pids[0] = fork()) == 0)
        replica(accept_one(r1_listen), copies[1]);
    if ((pids[1] = fork()) == 0)
        replica(accept_one(r2_listen), copies[2]);
    if ((pids[2] = fork()) == 0) {
        int client = accept_one(p_listen);
        primary(client, connect_to(r1_port), connect_to(r2_port), copies[0]);
    }
    int link = connect_to(p_port);
    char *data = aligned_alloc(BLK, BLK);
    memset(data, 0xa5, BLK);
    uint64_t cycles = 0;
    double start = now(), end = start + seconds;
    while (now() < end) {
        memcpy(data, &cycles, sizeof cycles);
        send_message(link, WRITE, 2 * cycles, data);
        receive(link, data);
        send_message(link, FLUSH, 2 * cycles + 1, NULL);
        receive(link, data);
        cycles++;
    }
    double took = now() - start;
    send_message(link, STOP, 0, NULL);
    for (int i = 0; i < 3; i++)
        waitpid(pids[i], NULL, 0);
    if (cycles == 0) {
        fprintf(stderr, "no cycle completed in %.1f s\n", took);
        return 1;
    }
    printf("cycle_us %.1f\n", took * 1e6 / cycles);
    return 0;
}
