/*
 * mqttrelay: a TCP relay in front of an MQTT broker that dates and counts, from the
 * broker's side of every connection, what a consumer does: when it connected, which
 * client id it gave, the PUBLISH packets the broker sent it and the PUBACK packets it
 * sent the broker. Nothing in the consumer times or counts itself.
 *
 *   mqttrelay BROKER_PORT TARGET
 * Listens on 127.0.0.1 (a free port, printed first as "PORT\n"), and for every
 * connection opens one to 127.0.0.1:BROKER_PORT and forwards bytes both ways, unchanged,
 * two blocking threads a connection (a consumer that stops reading stops the relay
 * reading from the broker: backpressure reaches the broker as without the relay). On
 * stdout, one line each:
 *   connect IDX NS          a consumer's connection accepted (CLOCK_MONOTONIC, ns)
 *   client IDX ID           the client id of its CONNECT packet
 *   progress PUBACKS PUBLISHES NS     at most every 20 ms, when a count moved
 *   processed NS            the broker has processed the TARGET-th PUBACK (below)
 *   closed IDX NS           both directions of a connection have ended
 * and on SIGTERM one JSON line with the totals and every connection, then exit 0.
 * A PUBACK is counted once the write that hands it to the broker's socket has returned;
 * "reached_ns" is when the PUBACKs of all connections together reached TARGET (0: not
 * reached). Right after the TARGET-th PUBACK the relay sends the broker one PINGREQ of
 * its own on that connection: the broker reads a connection's packets in order, so its
 * PINGRESP ("processed_ns", when it reached the relay) proves it has processed every
 * PUBACK before it. That PINGRESP is forwarded to the consumer like any other (MQTT
 * clients take a PINGRESP they did not ask for as a sign of life).
 *
 * Build: gcc -O2 -Wall -pthread -o mqttrelay mqttrelay.c  (bench/build.sh)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNECTIONS 256
#define PUBLISH 3
#define PUBACK 4
#define PINGREQ 12
#define PINGRESP 13

struct parser {  /* MQTT framing across reads: fixed header, remaining length, body */
    int state;   /* 0: type byte next, 1: in the remaining length, 2: in the body */
    int type;
    uint32_t remaining, multiplier;
    unsigned long long counts[16];  /* completed packets by type */
};

struct connection {
    int index, client, broker;
    int64_t connect_ns;
    char client_id[256];
    uint8_t head[4096];  /* the first bytes from the consumer, until CONNECT is parsed */
    size_t head_len;
    int head_done;
    atomic_ullong pubacks, publishes;
    atomic_llong first_publish_ns, last_publish_ns, last_puback_ns;
    atomic_ullong ping_index;  /* which PINGRESP answers the relay's PINGREQ (0: none) */
    struct parser up, down;
};

static struct connection *connections[MAX_CONNECTIONS];
static atomic_int n_connections;
static atomic_ullong total_pubacks, total_publishes;
static atomic_llong reached_ns, processed_ns;
static unsigned long long target;
static volatile sig_atomic_t stopping;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
    va_list ap;
    pthread_mutex_lock(&out_lock);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
    pthread_mutex_unlock(&out_lock);
}

/* Feed bytes, counting completed packets by type; with `stop` > 0, stop right after the
 * `stop`-th completed packet of type `type`. Returns the bytes consumed. */
static size_t feed(struct parser *p, const uint8_t *buf, size_t n, int type,
                   unsigned long long stop) {
    unsigned long long found = 0;
    size_t i = 0;
    while (i < n) {
        int completed = 0;
        if (p->state == 0) {
            p->type = buf[i++] >> 4;
            p->remaining = 0;
            p->multiplier = 1;
            p->state = 1;
        } else if (p->state == 1) {
            uint8_t b = buf[i++];
            p->remaining += (uint32_t)(b & 127) * p->multiplier;
            p->multiplier *= 128;
            if (!(b & 128)) {
                completed = p->remaining == 0;
                p->state = completed ? 0 : 2;
            }
        } else {
            size_t take = n - i < p->remaining ? n - i : p->remaining;
            i += take;
            p->remaining -= (uint32_t)take;
            completed = p->remaining == 0;
            if (completed) p->state = 0;
        }
        if (completed) {
            p->counts[p->type]++;
            if (stop && p->type == type && ++found == stop) return i;
        }
    }
    return i;
}

static size_t varint(const uint8_t *b, size_t n, size_t *at, int *ok) {
    size_t value = 0, mult = 1;
    for (int k = 0; k < 4 && *at < n; k++) {
        uint8_t byte = b[(*at)++];
        value += (size_t)(byte & 127) * mult;
        mult *= 128;
        if (!(byte & 128)) { *ok = 1; return value; }
    }
    *ok = 0;
    return 0;
}

/* The client id of a CONNECT packet (MQTT 3.1.1 or 5) once its head has arrived. */
static void parse_connect(struct connection *c) {
    const uint8_t *b = c->head;
    size_t n = c->head_len, at = 1;
    int ok;
    if (n < 2 || (b[0] >> 4) != 1) { c->head_done = 1; return; }
    size_t length = varint(b, n, &at, &ok);
    if (!ok) return;
    if (n < at + length) { if (n == sizeof c->head) c->head_done = 1; return; }
    c->head_done = 1;
    if (at + 2 > n) return;
    size_t name = (size_t)b[at] << 8 | b[at + 1];
    at += 2 + name;
    if (at + 4 > n) return;
    int level = b[at];
    at += 4;  /* level, flags, keep alive */
    if (level == 5) {
        size_t props = varint(b, n, &at, &ok);
        if (!ok) return;
        at += props;
    }
    if (at + 2 > n) return;
    size_t id = (size_t)b[at] << 8 | b[at + 1];
    at += 2;
    if (at + id > n || id >= sizeof c->client_id) return;
    memcpy(c->client_id, b + at, id);
    c->client_id[id] = 0;
    say("client %d %s\n", c->index, c->client_id);
}

static int write_all(int fd, const uint8_t *buf, size_t n) {
    while (n) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        buf += w;
        n -= (size_t)w;
    }
    return 0;
}

/* consumer -> broker: CONNECT's client id, PUBACKs, and the relay's PINGREQ after the
 * TARGET-th PUBACK */
static void *upstream(void *arg) {
    struct connection *c = arg;
    static __thread uint8_t buf[1 << 16];
    static const uint8_t pingreq[2] = {PINGREQ << 4, 0};
    for (;;) {
        ssize_t r = read(c->client, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        size_t n = (size_t)r;
        if (!c->head_done) {
            size_t take = sizeof c->head - c->head_len;
            if (take > n) take = n;
            memcpy(c->head + c->head_len, buf, take);
            c->head_len += take;
            parse_connect(c);
        }
        struct parser probe = c->up;
        feed(&probe, buf, n, 0, 0);
        unsigned long long acks = probe.counts[PUBACK] - c->up.counts[PUBACK];
        unsigned long long prior = acks ? atomic_fetch_add(&total_pubacks, acks) : 0;
        int crosses = target && acks && prior < target && prior + acks >= target;
        size_t split = crosses ? feed(&c->up, buf, n, PUBACK, target - prior) : n;
        if (!crosses) c->up = probe;
        if (write_all(c->broker, buf, split) < 0) break;
        if (acks) {
            int64_t t = now_ns();  /* the broker's socket has them now */
            atomic_fetch_add(&c->pubacks, acks);
            atomic_store(&c->last_puback_ns, t);
        }
        if (crosses) {
            atomic_store(&reached_ns, atomic_load(&c->last_puback_ns));
            /* every PINGREQ before it is the consumer's: the broker answers in order */
            atomic_store(&c->ping_index, c->up.counts[PINGREQ] + 1);
            if (write_all(c->broker, pingreq, sizeof pingreq) < 0) break;
            if (split < n) {
                feed(&c->up, buf + split, n - split, 0, 0);
                if (write_all(c->broker, buf + split, n - split) < 0) break;
            }
        }
    }
    shutdown(c->broker, SHUT_WR);  /* the consumer closed: so does its side at the broker */
    return NULL;
}

/* broker -> consumer: PUBLISHes, and the PINGRESP to the relay's PINGREQ */
static void *connection_main(void *arg) {
    struct connection *c = arg;
    pthread_t up;
    if (pthread_create(&up, NULL, upstream, c) != 0) {
        perror("mqttrelay: pthread_create");
        exit(1);
    }
    uint8_t *buf = malloc(1 << 18);
    if (!buf) { perror("mqttrelay: malloc"); exit(1); }
    int gone = 0;  /* the consumer's side failed: what the broker sends is read and dropped */
    for (;;) {
        ssize_t r = read(c->broker, buf, 1 << 18);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        int64_t t = now_ns();
        unsigned long long pubs = c->down.counts[PUBLISH];
        feed(&c->down, buf, (size_t)r, 0, 0);
        pubs = c->down.counts[PUBLISH] - pubs;
        if (pubs) {
            long long zero = 0;
            atomic_compare_exchange_strong(&c->first_publish_ns, &zero, t);
            atomic_store(&c->last_publish_ns, t);
            atomic_fetch_add(&c->publishes, pubs);
            atomic_fetch_add(&total_publishes, pubs);
        }
        unsigned long long ping = atomic_load(&c->ping_index);
        long long unset = 0;
        if (ping && c->down.counts[PINGRESP] >= ping
            && atomic_compare_exchange_strong(&processed_ns, &unset, t))
            say("processed %lld\n", (long long)t);
        /* A consumer gone (killed) leaves the broker's side open until the broker has read
         * what the relay passed on and closes it itself: closing a socket with unread
         * PUBLISHes in it would reset the connection, and a broker may drop the PUBACKs it
         * had not read yet. */
        if (!gone && write_all(c->client, buf, (size_t)r) < 0) gone = 1;
    }
    shutdown(c->client, SHUT_WR);
    pthread_join(up, NULL);
    close(c->client);
    close(c->broker);
    free(buf);
    say("closed %d %lld\n", c->index, (long long)now_ns());
    return NULL;
}

static int listen_any(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(fd, 64) < 0
        || getsockname(fd, (struct sockaddr *)&addr, &len) < 0) {
        perror("mqttrelay: listen");
        exit(1);
    }
    say("%d\n", ntohs(addr.sin_port));
    return fd;
}

static int dial(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

static void nodelay(int fd) {  /* forward each read as it came, as the broker wrote it */
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void accept_one(int listener, int broker_port) {
    int client = accept(listener, NULL, NULL);
    if (client < 0) return;
    int64_t t = now_ns();
    int index = atomic_load(&n_connections);
    int broker = index < MAX_CONNECTIONS ? dial(broker_port) : -1;
    if (broker < 0) {
        fprintf(stderr, "mqttrelay: no connection to the broker for connection %d\n", index);
        close(client);
        return;
    }
    nodelay(client);
    nodelay(broker);
    struct connection *c = calloc(1, sizeof *c);
    if (!c) { perror("mqttrelay: calloc"); exit(1); }
    c->index = index;
    c->client = client;
    c->broker = broker;
    c->connect_ns = t;
    connections[index] = c;
    atomic_store(&n_connections, index + 1);
    say("connect %d %lld\n", index, (long long)t);
    pthread_t thread;
    if (pthread_create(&thread, NULL, connection_main, c) != 0) {
        perror("mqttrelay: pthread_create");
        exit(1);
    }
    pthread_detach(thread);
}

static void report(void) {
    pthread_mutex_lock(&out_lock);
    printf("{\"pubacks\": %llu, \"publishes\": %llu, \"target\": %llu, \"reached_ns\": %lld, "
           "\"processed_ns\": %lld, \"connections\": [", atomic_load(&total_pubacks),
           atomic_load(&total_publishes), target, (long long)atomic_load(&reached_ns),
           (long long)atomic_load(&processed_ns));
    int n = atomic_load(&n_connections);
    for (int i = 0; i < n; i++) {
        struct connection *c = connections[i];
        printf("%s{\"client_id\": \"", i ? ", " : "");
        for (const char *s = c->client_id; *s; s++) {  /* JSON: the ids are plain text */
            if (*s == '"' || *s == '\\') putchar('\\');
            putchar(*s < 32 ? '?' : *s);
        }
        printf("\", \"connect_ns\": %lld, \"pubacks\": %llu, \"publishes\": %llu, "
               "\"first_publish_ns\": %lld, \"last_publish_ns\": %lld, "
               "\"last_puback_ns\": %lld}", (long long)c->connect_ns,
               atomic_load(&c->pubacks), atomic_load(&c->publishes),
               (long long)atomic_load(&c->first_publish_ns),
               (long long)atomic_load(&c->last_publish_ns),
               (long long)atomic_load(&c->last_puback_ns));
    }
    printf("]}\n");
    fflush(stdout);
    pthread_mutex_unlock(&out_lock);
}

static void on_signal(int sig) { (void)sig; stopping = 1; }

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: mqttrelay BROKER_PORT TARGET\n");
        return 2;
    }
    int broker_port = atoi(argv[1]);
    target = strtoull(argv[2], NULL, 10);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    int listener = listen_any();
    unsigned long long seen_acks = 0, seen_pubs = 0;
    while (!stopping) {
        struct pollfd p = {.fd = listener, .events = POLLIN};
        if (poll(&p, 1, 20) > 0) accept_one(listener, broker_port);
        unsigned long long acks = atomic_load(&total_pubacks);
        unsigned long long pubs = atomic_load(&total_publishes);
        if (acks != seen_acks || pubs != seen_pubs) {
            say("progress %llu %llu %lld\n", acks, pubs, (long long)now_ns());
            seen_acks = acks;
            seen_pubs = pubs;
        }
    }
    report();
    return 0;
}
