/*
 * idealsub: the reference consumer of the end-to-end benchmark, an MQTT 5 client written
 * for speed that acknowledges nothing before it is written.
 *
 *   idealsub [OPTIONS] HOST PORT CLIENT_ID FILTER OUTPUT
 *
 * It connects with Clean Start 0 and a Session Expiry Interval (a persistent session
 * under CLIENT_ID), subscribes to FILTER, and then repeats: one read() of up to
 * --read-size bytes (4 MiB) from the socket; every complete packet in the buffer is
 * parsed (a packet cut by the read, anywhere, the remaining-length varint included, is
 * kept for the next read); the payloads of that read's PUBLISH packets, each followed
 * by a newline (with --topics, "topic<TAB>payload\n"), go to OUTPUT in ONE write(); only
 * after that write has returned, the PUBACKs of that read's QoS 1 messages go to the
 * broker in one more write(). A message counts as done once its PUBACK is written (QoS
 * 1) or once it is written (QoS 0). A redelivery (DUP) is written and acknowledged like
 * any message; a message under a packet id whose earlier message is still waiting for
 * its PUBACK gets a PUBACK of its own (the broker deletes its oldest message with the
 * id on each).
 *
 * It stops after --count messages are done (the rest of a read stays unacknowledged,
 * for the broker to resend), after --idle seconds without a message, or on SIGTERM or
 * SIGINT between reads; sends DISCONNECT (the session stays), waits for the broker to
 * close the connection (it has then processed every PUBACK), prints its counts as one
 * JSON line on stdout and exits 0. A refused CONNACK or SUBACK, a DISCONNECT from the broker, a
 * closed connection, a malformed packet or a failed write is one line on stderr and
 * exit status 1 (2 for bad usage); nothing unwritten has been acknowledged then.
 *
 * Options: --qos 0|1 (subscription QoS, 1), --count N (0: no limit), --idle SECONDS
 * (10; 0: none), --read-size BYTES (4194304), --receive-maximum N (65535),
 * --session-expiry SECONDS (3600), --keepalive SECONDS (60; a PINGREQ goes out after
 * half of it without sending), --topics.
 *
 * Build: gcc -O2 -Wall -o idealsub idealsub.c  (bench/build.sh); libc only.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define CONNACK 2
#define PUBLISH 3
#define SUBACK 9
#define PINGRESP 13
#define DISCONNECT 14
#define SUBSCRIBE_ID 1

struct buffer {
    uint8_t *data;
    size_t len, cap;
};

static struct {
    int qos;
    long long count;
    double idle;
    size_t read_size;
    unsigned receive_maximum, session_expiry, keepalive;
    int topics;
    const char *host, *port, *client_id, *filter, *output;
} opt = {1, 0, 10.0, 4u << 20, 65535, 3600, 60, 0, NULL, NULL, NULL, NULL, NULL};

static struct {
    long long received, qos0, qos1, dup, reused, written, acked, reads, writes, bytes, pings;
    int session_present, granted_qos;
    double connected, last_done;
} n = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1, 0.0, 0.0};

static int sock = -1, out_fd = -1, connected, subscribed;
static double last_sent, last_message;
static struct buffer in, out, acks;
static uint8_t pending[65536];  /* packet ids received in this read, PUBACK not yet sent */
static volatile sig_atomic_t stop;

static void fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

static void fail(const char *fmt, ...) {
    va_list ap;
    char line[512];
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "idealsub: %s\n", line);
    exit(1);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void reserve(struct buffer *b, size_t more) {
    if (b->len + more <= b->cap) return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    uint8_t *data = realloc(b->data, cap);
    if (!data) fail("out of memory (%zu bytes)", cap);
    b->data = data;
    b->cap = cap;
}

static void put(struct buffer *b, const void *data, size_t len) {
    reserve(b, len);
    memcpy(b->data + b->len, data, len);
    b->len += len;
}

static void put_byte(struct buffer *b, uint8_t byte) { put(b, &byte, 1); }

static void put_u16(struct buffer *b, unsigned v) {
    uint8_t two[2] = {(uint8_t)(v >> 8), (uint8_t)v};
    put(b, two, 2);
}

static void put_u32(struct buffer *b, unsigned v) {
    uint8_t four[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    put(b, four, 4);
}

static void put_varint(struct buffer *b, size_t v) {
    do {
        uint8_t byte = v % 128;
        v /= 128;
        put_byte(b, byte | (v ? 128 : 0));
    } while (v);
}

static void put_str(struct buffer *b, const char *s) {
    put_u16(b, (unsigned)strlen(s));
    put(b, s, strlen(s));
}

/* write() all of it: one call unless the kernel takes less (a short write, a signal). */
static int write_all(int fd, const uint8_t *data, size_t len) {
    while (len) {
        ssize_t done = fd == sock ? send(fd, data, len, MSG_NOSIGNAL) : write(fd, data, len);
        if (done < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        data += done;
        len -= (size_t)done;
    }
    return 0;
}

static void send_packet(struct buffer *b, const char *what) {
    if (write_all(sock, b->data, b->len) < 0) fail("cannot send %s: %s", what, strerror(errno));
    last_sent = now();
}

/* A remaining length: 1 and the value and its size, 0 if cut short, -1 if malformed. */
static int varint(const uint8_t *p, size_t len, uint32_t *value, size_t *size) {
    uint32_t v = 0;
    for (size_t i = 0; i < 4; i++) {
        if (i >= len) return 0;
        v |= (uint32_t)(p[i] & 127) << (7 * i);
        if (!(p[i] & 128)) {
            *value = v;
            *size = i + 1;
            return 1;
        }
    }
    return -1;
}

struct reader {
    const uint8_t *p, *end;
    const char *packet;
};

static void need(struct reader *r, size_t len) {
    if ((size_t)(r->end - r->p) < len) fail("malformed %s: %zu bytes short", r->packet, len);
}

static unsigned u8(struct reader *r) {
    need(r, 1);
    return *r->p++;
}

static unsigned u16(struct reader *r) {
    need(r, 2);
    unsigned v = (unsigned)r->p[0] << 8 | r->p[1];
    r->p += 2;
    return v;
}

static uint32_t var(struct reader *r) {
    uint32_t v;
    size_t size;
    if (varint(r->p, (size_t)(r->end - r->p), &v, &size) != 1) fail("malformed %s", r->packet);
    r->p += size;
    return v;
}

static void skip(struct reader *r, size_t len) {
    need(r, len);
    r->p += len;
}

/* Walk a properties block: the Server Keep Alive and the Reason String are kept. */
static void properties(struct reader *r, unsigned *keepalive, char *reason, size_t reason_size) {
    uint32_t len = var(r);
    need(r, len);
    struct reader props = {r->p, r->p + len, r->packet};
    r->p += len;
    while (props.p < props.end) {
        unsigned id = u8(&props);
        switch (id) {
            case 0x01: case 0x17: case 0x19: case 0x24: case 0x25: case 0x28: case 0x29:
            case 0x2A:
                skip(&props, 1);
                break;
            case 0x13:
                if (keepalive) *keepalive = u16(&props);
                else skip(&props, 2);
                break;
            case 0x21: case 0x22: case 0x23:
                skip(&props, 2);
                break;
            case 0x02: case 0x11: case 0x18: case 0x27:
                skip(&props, 4);
                break;
            case 0x0B:
                var(&props);
                break;
            case 0x1F: {
                unsigned slen = u16(&props);
                need(&props, slen);
                if (reason && reason_size) {
                    int shown = (int)(slen < reason_size - 1 ? slen : reason_size - 1);
                    snprintf(reason, reason_size, ": %.*s", shown, (const char *)props.p);
                }
                props.p += slen;
                break;
            }
            case 0x03: case 0x08: case 0x09: case 0x12: case 0x15: case 0x16: case 0x1A:
            case 0x1C:
                skip(&props, u16(&props));
                break;
            case 0x26:
                skip(&props, u16(&props));
                skip(&props, u16(&props));
                break;
            default:
                fail("malformed %s: unknown property 0x%02x", r->packet, id);
        }
    }
}

static const char *reason_name(unsigned code) {
    switch (code) {
        case 0x80: return "unspecified error";
        case 0x81: return "malformed packet";
        case 0x82: return "protocol error";
        case 0x83: return "implementation specific error";
        case 0x84: return "unsupported protocol version";
        case 0x85: return "client identifier not valid";
        case 0x86: return "bad user name or password";
        case 0x87: return "not authorized";
        case 0x88: return "server unavailable";
        case 0x89: return "server busy";
        case 0x8A: return "banned";
        case 0x8B: return "server shutting down";
        case 0x8D: return "keep alive timeout";
        case 0x8E: return "session taken over";
        case 0x8F: return "topic filter invalid";
        case 0x97: return "quota exceeded";
        case 0x9E: return "shared subscriptions not supported";
        case 0xA1: return "subscription identifiers not supported";
        case 0xA2: return "wildcard subscriptions not supported";
        default: return "error";
    }
}

static void subscribe(void) {
    struct buffer b = {0};
    size_t flen = strlen(opt.filter);
    put_byte(&b, 0x82);
    put_varint(&b, 2 + 1 + 2 + flen + 1);
    put_u16(&b, SUBSCRIBE_ID);
    put_byte(&b, 0);  /* no properties */
    put_str(&b, opt.filter);
    put_byte(&b, (uint8_t)opt.qos);  /* options: the QoS; local messages, no retain flags */
    send_packet(&b, "SUBSCRIBE");
    free(b.data);
}

static void connack(struct reader *r) {
    if (connected) fail("a second CONNACK");
    unsigned flags = u8(r), code = u8(r);
    char reason[160] = "";
    unsigned keepalive = opt.keepalive;
    properties(r, &keepalive, reason, sizeof reason);
    if (code >= 0x80)
        fail("the broker refused the connection: reason 0x%02x (%s)%s", code, reason_name(code),
             reason);
    opt.keepalive = keepalive;  /* the Server Keep Alive, if it sent one */
    n.session_present = flags & 1;
    connected = 1;
    subscribe();
}

static void suback(struct reader *r) {
    if (u16(r) != SUBSCRIBE_ID) fail("a SUBACK for a SUBSCRIBE not sent");
    char reason[160] = "";
    properties(r, NULL, reason, sizeof reason);
    unsigned code = u8(r);
    if (code >= 0x80)
        fail("the broker refused the subscription to %s: reason 0x%02x (%s)%s", opt.filter, code,
             reason_name(code), reason);
    n.granted_qos = (int)code;
    subscribed = 1;
}

static void disconnect(struct reader *r) __attribute__((noreturn));

static void disconnect(struct reader *r) {
    unsigned code = r->p < r->end ? u8(r) : 0;
    char reason[160] = "";
    if (r->p < r->end) properties(r, NULL, reason, sizeof reason);
    fail("the broker disconnected: reason 0x%02x (%s)%s after %lld messages", code,
         code ? reason_name(code) : "normal", reason, n.received);
}

static void publish(uint8_t first, struct reader *r) {
    unsigned qos = (first >> 1) & 3, dup = first & 8;
    if (qos > 1) fail("a QoS %u message (subscribe at QoS 0 or 1)", qos);
    unsigned tlen = u16(r);
    need(r, tlen);
    const uint8_t *topic = r->p;
    r->p += tlen;
    unsigned mid = 0;
    if (qos) {
        mid = u16(r);
        if (!mid) fail("malformed PUBLISH: packet id 0");
    }
    properties(r, NULL, NULL, 0);
    size_t plen = (size_t)(r->end - r->p);
    reserve(&out, tlen + plen + 2);
    if (opt.topics) {
        memcpy(out.data + out.len, topic, tlen);
        out.len += tlen;
        out.data[out.len++] = '\t';
    }
    memcpy(out.data + out.len, r->p, plen);
    out.len += plen;
    out.data[out.len++] = '\n';
    n.received++;
    if (dup) n.dup++;
    if (!qos) {
        n.qos0++;
        return;
    }
    n.qos1++;
    if (pending[mid] && !dup) n.reused++;
    if (pending[mid] < 255) pending[mid]++;
    uint8_t puback[4] = {0x40, 2, (uint8_t)(mid >> 8), (uint8_t)mid};
    put(&acks, puback, 4);
}

/* The complete packets at the start of buf (up to --count messages); bytes consumed. */
static size_t parse(const uint8_t *buf, size_t len) {
    size_t off = 0;
    while (off < len) {
        if (opt.count && n.received >= opt.count) break;  /* the rest stays unacknowledged */
        uint32_t remaining;
        size_t size;
        int ok = varint(buf + off + 1, len - off - 1, &remaining, &size);
        if (ok < 0) fail("malformed remaining length");
        if (!ok || len - off - 1 - size < remaining) break;  /* cut by the read */
        uint8_t first = buf[off];
        const uint8_t *body = buf + off + 1 + size;
        struct reader r = {body, body + remaining, "packet"};
        unsigned type = first >> 4;
        if (!connected && type != CONNACK) fail("packet type %u before CONNACK", type);
        switch (type) {
            case PUBLISH:
                r.packet = "PUBLISH";
                publish(first, &r);
                break;
            case CONNACK:
                r.packet = "CONNACK";
                connack(&r);
                break;
            case SUBACK:
                r.packet = "SUBACK";
                suback(&r);
                break;
            case PINGRESP:
                break;  /* ours, or the benchmark relay's */
            case DISCONNECT:
                r.packet = "DISCONNECT";
                disconnect(&r);
            default:
                fail("unexpected packet type %u", type);
        }
        off += 1 + size + remaining;
    }
    return off;
}

/* Write the read's messages (one write), then send their PUBACKs (one more). */
static void finish_read(void) {
    if (!out.len) return;
    if (write_all(out_fd, out.data, out.len) < 0)
        fail("cannot write to %s: %s (nothing of it acknowledged)", opt.output, strerror(errno));
    n.writes++;
    long long messages = n.received - n.written;
    n.written = n.received;
    out.len = 0;
    if (acks.len) {
        send_packet(&acks, "PUBACK");
        n.acked += (long long)(acks.len / 4);
        for (size_t i = 0; i < acks.len; i += 4)
            pending[(unsigned)acks.data[i + 2] << 8 | acks.data[i + 3]] = 0;
        acks.len = 0;
    }
    n.last_done = now();
    if (messages) last_message = n.last_done;
}

static void connect_socket(void) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
    int rc = getaddrinfo(opt.host, opt.port, &hints, &res);
    if (rc) fail("cannot resolve %s: %s", opt.host, gai_strerror(rc));
    for (struct addrinfo *a = res; a && sock < 0; a = a->ai_next) {
        sock = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (sock >= 0 && connect(sock, a->ai_addr, a->ai_addrlen) < 0) {
            close(sock);
            sock = -1;
        }
    }
    freeaddrinfo(res);
    if (sock < 0) fail("cannot connect to %s:%s: %s", opt.host, opt.port, strerror(errno));
    int one = 1;
    setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct buffer b = {0}, body = {0};
    put_str(&body, "MQTT");
    put_byte(&body, 5);
    put_byte(&body, 0);  /* Clean Start 0: resume the session */
    put_u16(&body, opt.keepalive);
    put_varint(&body, 5 + 3);
    put_byte(&body, 0x11);  /* Session Expiry Interval */
    put_u32(&body, opt.session_expiry);
    put_byte(&body, 0x21);  /* Receive Maximum */
    put_u16(&body, opt.receive_maximum);
    put_str(&body, opt.client_id);
    put_byte(&b, 0x10);
    put_varint(&b, body.len);
    put(&b, body.data, body.len);
    n.connected = now();
    send_packet(&b, "CONNECT");
    free(b.data);
    free(body.data);
}

/* DISCONNECT (normal: the session stays), then wait (up to 5 s) for the broker to close
 * the connection: it has then read every PUBACK before it. What it sent meanwhile is
 * not acknowledged, so it keeps it for the session. */
static void goodbye(void) {
    struct buffer bye = {(uint8_t[]){0xE0, 0}, 2, 2};
    send_packet(&bye, "DISCONNECT");
    shutdown(sock, SHUT_WR);
    double deadline = now() + 5.0;
    for (double t = now(); t < deadline; t = now()) {
        struct pollfd pfd = {.fd = sock, .events = POLLIN};
        if (poll(&pfd, 1, (int)((deadline - t) * 1000) + 1) < 0 && errno != EINTR) return;
        reserve(&in, 65536);
        ssize_t got = read(sock, in.data, 65536);
        if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) return;
    }
}

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static void usage(void) {
    fprintf(stderr,
            "usage: idealsub [--qos 0|1] [--count N] [--idle SECONDS] [--read-size BYTES]\n"
            "                [--receive-maximum N] [--session-expiry SECONDS]\n"
            "                [--keepalive SECONDS] [--topics] HOST PORT CLIENT_ID FILTER OUTPUT\n");
    exit(2);
}

static long long number(const char *text, const char *name, long long low, long long high) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || *end || end == text || v < low || v > high) {
        fprintf(stderr, "idealsub: --%s: %s is not a whole number from %lld to %lld\n", name,
                text, low, high);
        exit(2);
    }
    return v;
}

static void parse_args(int argc, char **argv) {
    static const struct option longs[] = {
        {"qos", required_argument, 0, 'q'},
        {"count", required_argument, 0, 'n'},
        {"idle", required_argument, 0, 'W'},
        {"read-size", required_argument, 0, 'r'},
        {"receive-maximum", required_argument, 0, 'm'},
        {"session-expiry", required_argument, 0, 'x'},
        {"keepalive", required_argument, 0, 'k'},
        {"topics", no_argument, 0, 't'},
        {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
            case 'q': opt.qos = (int)number(optarg, "qos", 0, 1); break;
            case 'n': opt.count = number(optarg, "count", 0, 1LL << 62); break;
            case 'W': {
                char *end;
                opt.idle = strtod(optarg, &end);
                if (*end || end == optarg || opt.idle < 0) {
                    fprintf(stderr, "idealsub: --idle: %s is not a number of seconds\n", optarg);
                    exit(2);
                }
                break;
            }
            case 'r': opt.read_size = (size_t)number(optarg, "read-size", 1, 1 << 30); break;
            case 'm': opt.receive_maximum = (unsigned)number(optarg, "receive-maximum", 1, 65535); break;
            case 'x': opt.session_expiry = (unsigned)number(optarg, "session-expiry", 0, 0xFFFFFFFFLL); break;
            case 'k': opt.keepalive = (unsigned)number(optarg, "keepalive", 0, 65535); break;
            case 't': opt.topics = 1; break;
            default: usage();
        }
    }
    if (argc - optind != 5) usage();
    opt.host = argv[optind];
    opt.port = argv[optind + 1];
    opt.client_id = argv[optind + 2];
    opt.filter = argv[optind + 3];
    opt.output = argv[optind + 4];
}

int main(int argc, char **argv) {
    parse_args(argc, argv);
    out_fd = open(opt.output, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out_fd < 0) {
        fprintf(stderr, "idealsub: cannot open %s: %s\n", opt.output, strerror(errno));
        return 2;
    }
    struct sigaction sa = {.sa_handler = on_signal};  /* no SA_RESTART: poll returns */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    connect_socket();
    last_message = n.connected;
    const char *ended = "signal";
    while (!stop) {
        double t = now();
        if (opt.count && n.written >= opt.count) {
            ended = "count";
            break;
        }
        if (opt.idle > 0 && t - last_message >= opt.idle) {
            if (!connected) fail("no CONNACK within %g s", opt.idle);
            ended = "idle";
            break;
        }
        if (connected && opt.keepalive && t - last_sent >= opt.keepalive / 2.0) {
            struct buffer ping = {(uint8_t[]){0xC0, 0}, 2, 2};
            send_packet(&ping, "PINGREQ");
            n.pings++;
        }
        double wait = opt.idle > 0 ? last_message + opt.idle - t : 3600;
        if (connected && opt.keepalive && last_sent + opt.keepalive / 2.0 - t < wait)
            wait = last_sent + opt.keepalive / 2.0 - t;
        struct pollfd pfd = {.fd = sock, .events = POLLIN};
        int ready = poll(&pfd, 1, wait > 0 ? (int)(wait * 1000) + 1 : 0);
        if (ready < 0 && errno != EINTR) fail("poll: %s", strerror(errno));
        if (ready <= 0) continue;
        reserve(&in, opt.read_size);
        ssize_t got = read(sock, in.data + in.len, opt.read_size);
        if (got < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            fail("cannot read from the broker: %s after %lld messages", strerror(errno),
                 n.received);
        }
        if (got == 0) fail("the broker closed the connection after %lld messages", n.received);
        n.reads++;
        n.bytes += got;
        in.len += (size_t)got;
        size_t used = parse(in.data, in.len);
        finish_read();
        memmove(in.data, in.data + used, in.len - used);
        in.len -= used;
    }
    if (connected) goodbye();
    close(sock);
    close(out_fd);
    printf("{\"received\": %lld, \"written\": %lld, \"acked\": %lld, \"qos0\": %lld, "
           "\"qos1\": %lld, \"dup\": %lld, \"reused\": %lld, \"reads\": %lld, "
           "\"writes\": %lld, \"bytes\": %lld, \"pings\": %lld, \"session_present\": %s, "
           "\"granted_qos\": %d, \"seconds\": %.6f, \"ended\": \"%s\"}\n",
           n.received, n.written, n.acked, n.qos0, n.qos1, n.dup, n.reused, n.reads, n.writes,
           n.bytes, n.pings, n.session_present ? "true" : "false", n.granted_qos,
           n.last_done ? n.last_done - n.connected : 0.0, ended);
    return 0;
}
