/*
 * qos1pub: publish every line of a file at QoS 1 and count the broker's PUBACKs.
 *
 *   qos1pub HOST PORT FILE [WINDOW]
 * FILE holds one message a line: "topic<TAB>payload". Up to WINDOW (default 1000)
 * messages are in flight; the program waits for the PUBACK of every one, prints
 * {"published": N, "acked": M, "seconds": S} and exits 0 only if M == N, so a run whose
 * delivery the broker did not confirm cannot pass for a complete one. MQTT 3.1.1, clean
 * session, no retries (a lost connection is a failure, reported as such).
 *
 * Build: gcc -O2 -Wall -o qos1pub qos1pub.c  (bench/build.sh)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint8_t *out;
static size_t out_len, out_cap;

static void put(const void *data, size_t n) {
    if (out_len + n > out_cap) {
        out_cap = (out_len + n) * 2;
        out = realloc(out, out_cap);
        if (!out) { perror("qos1pub: realloc"); exit(1); }
    }
    memcpy(out + out_len, data, n);
    out_len += n;
}

static void put_varint(size_t n) {
    do {
        uint8_t b = n % 128;
        n /= 128;
        if (n) b |= 128;
        put(&b, 1);
    } while (n);
}

static void put_str(const char *s, size_t n) {
    uint8_t len[2] = {(uint8_t)(n >> 8), (uint8_t)n};
    put(len, 2);
    put(s, n);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int flush_out(int fd) {
    size_t sent = 0;
    while (sent < out_len) {
        ssize_t n = send(fd, out + sent, out_len - sent, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            return -1;
        }
        sent += (size_t)n;
    }
    memmove(out, out + sent, out_len - sent);
    out_len -= sent;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: qos1pub HOST PORT FILE [WINDOW]\n");
        return 2;
    }
    long window = argc > 4 ? atol(argv[4]) : 1000;
    FILE *f = fopen(argv[3], "rb");
    struct stat sb;
    if (!f || fstat(fileno(f), &sb) < 0) { perror("qos1pub: input"); return 2; }
    char *data = malloc((size_t)sb.st_size + 1);
    if (fread(data, 1, (size_t)sb.st_size, f) != (size_t)sb.st_size) {
        perror("qos1pub: read");
        return 2;
    }
    fclose(f);
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &addr.sin_addr);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        fprintf(stderr, "qos1pub: cannot connect to %s:%s: %s\n", argv[1], argv[2],
                strerror(errno));
        return 1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char client_id[32];
    snprintf(client_id, sizeof client_id, "qos1pub-%d", (int)getpid());
    /* CONNECT: protocol "MQTT" level 4, clean session, keep alive 600 s. */
    size_t idlen = strlen(client_id);
    uint8_t hdr = 0x10;
    put(&hdr, 1);
    put_varint(10 + 2 + idlen);
    put_str("MQTT", 4);
    uint8_t rest[4] = {4, 0x02, 600 >> 8, 600 & 0xff};
    put(rest, 4);
    put_str(client_id, idlen);
    if (flush_out(fd) < 0 || out_len) { perror("qos1pub: connect"); return 1; }
    uint8_t connack[4];
    if (recv(fd, connack, 4, MSG_WAITALL) != 4 || connack[0] != 0x20 || connack[3] != 0) {
        fprintf(stderr, "qos1pub: the broker refused the connection\n");
        return 1;
    }
    double started = now();
    long published = 0, acked = 0;
    char *p = data, *end = data + sb.st_size;
    uint16_t mid = 0;
    uint8_t in[65536];
    size_t in_len = 0;
    int done_reading = 0;
    while (!done_reading || acked < published) {
        while (!done_reading && published - acked < window && out_len < 262144) {
            char *nl = memchr(p, '\n', (size_t)(end - p));
            char *line_end = nl ? nl : end;
            if (p >= end) { done_reading = 1; break; }
            char *tab = memchr(p, '\t', (size_t)(line_end - p));
            if (!tab) {
                fprintf(stderr, "qos1pub: line %ld has no tab\n", published + 1);
                return 2;
            }
            size_t tlen = (size_t)(tab - p), plen = (size_t)(line_end - tab - 1);
            mid = mid == 65535 ? 1 : mid + 1;
            uint8_t h = 0x32, id[2] = {(uint8_t)(mid >> 8), (uint8_t)mid};
            put(&h, 1);
            put_varint(2 + tlen + 2 + plen);
            put_str(p, tlen);
            put(id, 2);
            put(tab + 1, plen);
            published++;
            p = nl ? nl + 1 : end;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN | (out_len ? POLLOUT : 0)};
        if (poll(&pfd, 1, 30000) <= 0) {
            fprintf(stderr, "qos1pub: no progress for 30 s\n");
            break;
        }
        if (pfd.revents & POLLOUT && flush_out(fd) < 0) { perror("qos1pub: send"); break; }
        if (pfd.revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t n = recv(fd, in + in_len, sizeof in - in_len, MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN)) {
                fprintf(stderr, "qos1pub: the broker closed the connection\n");
                break;
            }
            if (n > 0) in_len += (size_t)n;
            size_t off = 0;
            while (in_len - off >= 2) {  /* PUBACK: 0x40 0x02 id id; nothing else expected */
                if (in[off] != 0x40 || in[off + 1] != 2) {
                    fprintf(stderr, "qos1pub: unexpected packet 0x%02x\n", in[off]);
                    return 1;
                }
                if (in_len - off < 4) break;
                acked++;
                off += 4;
            }
            memmove(in, in + off, in_len - off);
            in_len -= off;
        }
    }
    double seconds = now() - started;
    uint8_t disconnect[2] = {0xe0, 0};
    send(fd, disconnect, 2, MSG_NOSIGNAL);
    close(fd);
    printf("{\"published\": %ld, \"acked\": %ld, \"seconds\": %.6f}\n", published, acked, seconds);
    return acked == published && done_reading ? 0 : 1;
}
