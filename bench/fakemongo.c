/*
 * fakemongo: a stand-in for MongoDB that answers at once and counts what it receives.
 *
 * It speaks enough of the wire protocol (OP_MSG, and OP_QUERY for a legacy hello) for
 * pymongo to connect, create collections and indexes, and send inserts and bulk updates.
 * It behaves like a database that never keeps anything: every insert succeeds, every
 * upsert inserts, a plain update or delete matches nothing, find and aggregate return
 * nothing. It only remembers the collections created (so listCollections can show them).
 * There is no storage engine, no index maintenance, no journaling and no network delay:
 * it measures the client's side of the write path, not a server. Inserts into a
 * collection named *_claims (timeseries mode's claims) are counted apart.
 *
 *   fakemongo [-p PORT] [-v]     prints mongodb://127.0.0.1:PORT, serves until SIGTERM,
 *                                then prints its counts as one line of JSON and exits.
 * The counts are also the reply to the commands fakemongoStats and serverStatus (field
 * "fakemongo"); fakemongoReset zeroes them. -v logs every command name to stderr.
 *
 * Build: gcc -O2 -Wall -o fakemongo fakemongo.c  (bench/build.sh)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define OP_REPLY 1
#define OP_QUERY 2004
#define OP_MSG 2013
#define MAX_CONNS 256
#define MAX_NAMES 64
#define MAX_COLLS 256
#define MAX_MESSAGE (48 * 1000 * 1000)

typedef struct { uint8_t *p; size_t len, cap; } buf_t;

static void b_put(buf_t *b, const void *data, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) { perror("fakemongo: realloc"); exit(1); }
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}
static void b_u8(buf_t *b, uint8_t v) { b_put(b, &v, 1); }
static void b_i32(buf_t *b, int32_t v) { b_put(b, &v, 4); }
static void b_i64(buf_t *b, int64_t v) { b_put(b, &v, 8); }
static void b_set32(buf_t *b, size_t at, int32_t v) { memcpy(b->p + at, &v, 4); }

/* BSON building: begin returns the offset of the length, end closes the document. */
static size_t d_begin(buf_t *b) { size_t at = b->len; b_i32(b, 0); return at; }
static void d_end(buf_t *b, size_t at) { b_u8(b, 0); b_set32(b, at, (int32_t)(b->len - at)); }
static void e_key(buf_t *b, uint8_t type, const char *key) {
    b_u8(b, type);
    b_put(b, key, strlen(key) + 1);
}
static void e_f64(buf_t *b, const char *k, double v) { e_key(b, 0x01, k); b_put(b, &v, 8); }
static void e_i32(buf_t *b, const char *k, int32_t v) { e_key(b, 0x10, k); b_i32(b, v); }
static void e_i64(buf_t *b, const char *k, int64_t v) { e_key(b, 0x12, k); b_i64(b, v); }
static void e_bool(buf_t *b, const char *k, int v) { e_key(b, 0x08, k); b_u8(b, v ? 1 : 0); }
static void e_str(buf_t *b, const char *k, const char *s) {
    e_key(b, 0x02, k);
    b_i32(b, (int32_t)strlen(s) + 1);
    b_put(b, s, strlen(s) + 1);
}
static size_t e_doc(buf_t *b, const char *k) { e_key(b, 0x03, k); return d_begin(b); }
static size_t e_arr(buf_t *b, const char *k) { e_key(b, 0x04, k); return d_begin(b); }

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
static int64_t wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* BSON reading: one element at a time, bounds-checked. */
typedef struct { uint8_t type; const char *key; const uint8_t *val; size_t vlen; } elem_t;

static int32_t rd32(const uint8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }

static long value_size(uint8_t type, const uint8_t *v, size_t left) {
    size_t n;
    switch (type) {
    case 0x01: case 0x09: case 0x11: case 0x12: return 8;
    case 0x02: case 0x0D: case 0x0E:
        return left < 4 ? -1 : 4 + (long)rd32(v);
    case 0x03: case 0x04: case 0x0F:
        return left < 4 ? -1 : (long)rd32(v);
    case 0x05: return left < 4 ? -1 : 5 + (long)rd32(v);
    case 0x06: case 0x0A: case 0x7F: case 0xFF: return 0;
    case 0x07: return 12;
    case 0x08: return 1;
    case 0x0B:
        n = strnlen((const char *)v, left);
        if (n >= left) return -1;
        return (long)(n + 1 + strnlen((const char *)v + n + 1, left - n - 1) + 1);
    case 0x0C: return left < 4 ? -1 : 4 + (long)rd32(v) + 12;
    case 0x10: return 4;
    case 0x13: return 16;
    default: return -1;
    }
}

/* Next element of the document at doc (offset *off, start at 4); 0 at the end, -1 if bad. */
static int next_elem(const uint8_t *doc, size_t *off, elem_t *e) {
    size_t total = (size_t)rd32(doc);
    if (*off >= total - 1) return 0;
    e->type = doc[*off];
    e->key = (const char *)doc + *off + 1;
    size_t klen = strnlen(e->key, total - *off - 1);
    if (*off + 1 + klen >= total) return -1;
    e->val = doc + *off + 2 + klen;
    long size = value_size(e->type, e->val, total - (*off + 2 + klen));
    if (size < 0 || *off + 2 + klen + (size_t)size > total - 1) return -1;
    e->vlen = (size_t)size;
    *off += 2 + klen + (size_t)size;
    return 1;
}

static int find_elem(const uint8_t *doc, const char *key, elem_t *e) {
    size_t off = 4;
    while (next_elem(doc, &off, e) == 1)
        if (strcmp(e->key, key) == 0) return 1;
    return 0;
}

static int truthy(const elem_t *e) {
    switch (e->type) {
    case 0x08: return e->val[0] != 0;
    case 0x10: return rd32(e->val) != 0;
    case 0x12: { int64_t v; memcpy(&v, e->val, 8); return v != 0; }
    case 0x01: { double v; memcpy(&v, e->val, 8); return v != 0; }
    default: return 0;
    }
}

static int doc_valid(const uint8_t *p, size_t avail) {
    if (avail < 5) return 0;
    int32_t len = rd32(p);
    return len >= 5 && (size_t)len <= avail && p[len - 1] == 0;
}

/* What it counts. */
static struct {
    int64_t messages, op_msgs, op_queries, bytes_in;
    int64_t insert_commands, inserted_documents;
    int64_t claim_commands, claim_documents; /* inserts into a *_claims collection */
    int64_t ledger_documents;  /* inserted into "deliveries" (the daemon's delivery ledger) */
    int64_t update_commands, update_ops, upserts, pushed;
    int64_t delete_commands, delete_ops;
    int64_t first_write_ns, last_write_ns;
    int64_t connections_total;
    int names;
    char name[MAX_NAMES][48];
    int64_t count[MAX_NAMES];
} st;
static int64_t started_ns;
static int verbose;
static int conns_current;

static struct { char ns[300]; buf_t options; int timeseries; } colls[MAX_COLLS];
static int ncolls;

static void count_command(const char *name) {
    for (int i = 0; i < st.names; i++)
        if (strcmp(st.name[i], name) == 0) { st.count[i]++; return; }
    if (st.names < MAX_NAMES) {
        snprintf(st.name[st.names], sizeof st.name[0], "%s", name);
        st.count[st.names++] = 1;
    }
}

static void stats_doc(buf_t *b) {
    e_i64(b, "messages", st.messages);
    e_i64(b, "opMsg", st.op_msgs);
    e_i64(b, "opQuery", st.op_queries);
    e_i64(b, "bytesIn", st.bytes_in);
    e_i64(b, "insertCommands", st.insert_commands);
    e_i64(b, "insertedDocuments", st.inserted_documents);
    e_i64(b, "claimCommands", st.claim_commands);
    e_i64(b, "claimDocuments", st.claim_documents);
    e_i64(b, "ledgerDocuments", st.ledger_documents);
    e_i64(b, "updateCommands", st.update_commands);
    e_i64(b, "updateOps", st.update_ops);
    e_i64(b, "upserts", st.upserts);
    e_i64(b, "pushedElements", st.pushed);
    e_i64(b, "deleteCommands", st.delete_commands);
    e_i64(b, "deleteOps", st.delete_ops);
    e_i64(b, "firstWriteMonotonicNs", st.first_write_ns);
    e_i64(b, "lastWriteMonotonicNs", st.last_write_ns);
    e_i64(b, "connectionsTotal", st.connections_total);
    size_t at = e_doc(b, "commands");
    for (int i = 0; i < st.names; i++) e_i64(b, st.name[i], st.count[i]);
    d_end(b, at);
}

static void print_stats_json(FILE *f) {
    fprintf(f, "{\"messages\": %lld, \"opMsg\": %lld, \"opQuery\": %lld, \"bytesIn\": %lld, "
            "\"insertCommands\": %lld, \"insertedDocuments\": %lld, "
            "\"claimCommands\": %lld, \"claimDocuments\": %lld, \"ledgerDocuments\": %lld, "
            "\"updateCommands\": %lld, "
            "\"updateOps\": %lld, \"upserts\": %lld, \"pushedElements\": %lld, "
            "\"deleteCommands\": %lld, "
            "\"deleteOps\": %lld, \"firstWriteMonotonicNs\": %lld, "
            "\"lastWriteMonotonicNs\": %lld, \"connectionsTotal\": %lld, \"commands\": {",
            (long long)st.messages, (long long)st.op_msgs, (long long)st.op_queries,
            (long long)st.bytes_in, (long long)st.insert_commands,
            (long long)st.inserted_documents, (long long)st.claim_commands,
            (long long)st.claim_documents, (long long)st.ledger_documents,
            (long long)st.update_commands,
            (long long)st.update_ops, (long long)st.upserts, (long long)st.pushed,
            (long long)st.delete_commands,
            (long long)st.delete_ops, (long long)st.first_write_ns, (long long)st.last_write_ns,
            (long long)st.connections_total);
    for (int i = 0; i < st.names; i++)
        fprintf(f, "%s\"%s\": %lld", i ? ", " : "", st.name[i], (long long)st.count[i]);
    fprintf(f, "}}\n");
    fflush(f);
}

static void note_write(void) {
    int64_t t = now_ns();
    if (!st.first_write_ns) st.first_write_ns = t;
    st.last_write_ns = t;
}

static void ok_field(buf_t *b) { e_f64(b, "ok", 1.0); }

static void error_reply(buf_t *b, int code, const char *name, const char *msg) {
    e_f64(b, "ok", 0.0);
    e_str(b, "errmsg", msg);
    e_i32(b, "code", code);
    e_str(b, "codeName", name);
}

static void hello_reply(buf_t *b, int conn_id) {
    e_bool(b, "helloOk", 1);
    e_bool(b, "ismaster", 1);
    e_bool(b, "isWritablePrimary", 1);
    e_i32(b, "maxBsonObjectSize", 16 * 1024 * 1024);
    e_i32(b, "maxMessageSizeBytes", MAX_MESSAGE);
    e_i32(b, "maxWriteBatchSize", 100000);
    e_key(b, 0x09, "localTime"); b_i64(b, wall_ms());
    e_i32(b, "logicalSessionTimeoutMinutes", 30);
    e_i32(b, "connectionId", conn_id);
    e_i32(b, "minWireVersion", 0);
    e_i32(b, "maxWireVersion", 21);
    e_bool(b, "readOnly", 0);
    ok_field(b);
}

static void empty_cursor(buf_t *b, const char *ns) {
    size_t at = e_doc(b, "cursor");
    e_i64(b, "id", 0);
    e_str(b, "ns", ns);
    size_t arr = e_arr(b, "firstBatch");
    d_end(b, arr);
    d_end(b, at);
    ok_field(b);
}

/* Options of a create command: every field but the command name and generic fields. */
static int generic_field(const char *key) {
    static const char *skip[] = {"create", "$db", "lsid", "$clusterTime", "$readPreference",
                                 "writeConcern", "txnNumber", "apiVersion", "apiStrict",
                                 "apiDeprecationErrors", "comment", NULL};
    for (int i = 0; skip[i]; i++)
        if (strcmp(key, skip[i]) == 0) return 1;
    return 0;
}

static void create_collection(buf_t *b, const uint8_t *body, const char *db, const char *name) {
    char ns[300];
    snprintf(ns, sizeof ns, "%s.%s", db, name);
    for (int i = 0; i < ncolls; i++)
        if (strcmp(colls[i].ns, ns) == 0) {
            error_reply(b, 48, "NamespaceExists", "Collection already exists.");
            return;
        }
    if (ncolls == MAX_COLLS) {
        error_reply(b, 1, "InternalError", "fakemongo: too many collections");
        return;
    }
    snprintf(colls[ncolls].ns, sizeof colls[0].ns, "%s", ns);
    buf_t *o = &colls[ncolls].options;
    o->len = 0;
    size_t at = d_begin(o), off = 4;
    elem_t e;
    while (next_elem(body, &off, &e) == 1) {
        if (generic_field(e.key)) continue;
        if (strcmp(e.key, "timeseries") == 0) colls[ncolls].timeseries = 1;
        b_u8(o, e.type);
        b_put(o, e.key, strlen(e.key) + 1);
        b_put(o, e.val, e.vlen);
    }
    d_end(o, at);
    ncolls++;
    ok_field(b);
}

static void list_collections(buf_t *b, const uint8_t *body, const char *db) {
    const char *want = NULL;
    elem_t f, n;
    if (find_elem(body, "filter", &f) && f.type == 0x03 && find_elem(f.val, "name", &n) &&
        n.type == 0x02)
        want = (const char *)n.val + 4;
    char ns[300];
    snprintf(ns, sizeof ns, "%s.$cmd.listCollections", db);
    size_t cur = e_doc(b, "cursor");
    e_i64(b, "id", 0);
    e_str(b, "ns", ns);
    size_t arr = e_arr(b, "firstBatch");
    int index = 0;
    size_t dblen = strlen(db);
    for (int i = 0; i < ncolls; i++) {
        const char *cname = colls[i].ns + dblen + 1;
        if (strncmp(colls[i].ns, db, dblen) != 0 || colls[i].ns[dblen] != '.') continue;
        if (want && strcmp(want, cname) != 0) continue;
        char key[16];
        snprintf(key, sizeof key, "%d", index++);
        size_t d = e_doc(b, key);
        e_str(b, "name", cname);
        e_str(b, "type", colls[i].timeseries ? "timeseries" : "collection");
        e_key(b, 0x03, "options");
        b_put(b, colls[i].options.p, colls[i].options.len);
        size_t info = e_doc(b, "info");
        e_bool(b, "readOnly", 0);
        d_end(b, info);
        d_end(b, d);
    }
    d_end(b, arr);
    d_end(b, cur);
    ok_field(b);
}

/* Documents of a command: in a kind-1 sequence (seq, n) or inline in the body array. */
typedef struct { const uint8_t *seq; size_t len; } docs_t;

static int each_doc(const uint8_t *body, const char *field, docs_t *docs,
                    int (*fn)(const uint8_t *doc, int index, void *ctx), void *ctx) {
    int n = 0;
    if (docs->seq) {
        size_t off = 0;
        while (off < docs->len && doc_valid(docs->seq + off, docs->len - off)) {
            if (fn) fn(docs->seq + off, n, ctx);
            n++;
            off += (size_t)rd32(docs->seq + off);
        }
        return n;
    }
    elem_t arr, e;
    if (!find_elem(body, field, &arr) || arr.type != 0x04) return 0;
    size_t off = 4;
    while (next_elem(arr.val, &off, &e) == 1) {
        if (e.type != 0x03) continue;
        if (fn) fn(e.val, n, ctx);
        n++;
    }
    return n;
}

typedef struct { buf_t *b; int upserts; } upsert_ctx;

/* Elements an update document's $push adds: the length of each $each, else 1 a field. */
static int64_t pushed(const uint8_t *update) {
    elem_t u, push, field, each;
    if (!find_elem(update, "u", &u) || u.type != 0x03 || !find_elem(u.val, "$push", &push) ||
        push.type != 0x03)
        return 0;
    int64_t n = 0;
    size_t off = 4;
    while (next_elem(push.val, &off, &field) == 1) {
        if (field.type == 0x03 && find_elem(field.val, "$each", &each) && each.type == 0x04) {
            size_t eoff = 4;
            elem_t item;
            while (next_elem(each.val, &eoff, &item) == 1) n++;
        } else {
            n++;
        }
    }
    return n;
}

static int upsert_entry(const uint8_t *doc, int index, void *vctx) {
    upsert_ctx *ctx = vctx;
    elem_t u;
    st.pushed += pushed(doc);
    if (!(find_elem(doc, "upsert", &u) && truthy(&u))) return 0;
    char key[16];
    snprintf(key, sizeof key, "%d", ctx->upserts++);
    size_t d = e_doc(ctx->b, key);
    e_i32(ctx->b, "index", index);
    e_key(ctx->b, 0x07, "_id");
    uint8_t oid[12] = {0xfa, 0x4e, 0x11, 0x60};
    int64_t serial = st.upserts + ctx->upserts;
    memcpy(oid + 4, &serial, 8);
    b_put(ctx->b, oid, 12);
    d_end(ctx->b, d);
    return 1;
}

static void command(buf_t *b, const uint8_t *body, const char *db, docs_t *docs, int conn_id) {
    elem_t first;
    size_t off = 4;
    if (next_elem(body, &off, &first) != 1) {
        error_reply(b, 9, "FailedToParse", "empty command");
        return;
    }
    const char *name = first.key;
    const char *arg = first.type == 0x02 ? (const char *)first.val + 4 : "";
    count_command(name);
    if (verbose) fprintf(stderr, "fakemongo: %s %s.%s\n", name, db, arg);
    char ns[300];
    snprintf(ns, sizeof ns, "%s.%s", db, arg);
    if (!strcmp(name, "insert") && !strcmp(arg, "deliveries")) {
        /* The delivery ledger, not readings: counted apart. */
        int n = each_doc(body, "documents", docs, NULL, NULL);
        st.ledger_documents += n;
        e_i32(b, "n", n);
        ok_field(b);
    } else if (!strcmp(name, "insert")) {
        int n = each_doc(body, "documents", docs, NULL, NULL);
        size_t len = strlen(arg);
        if (len > 7 && !strcmp(arg + len - 7, "_claims")) {  /* timeseries mode's claims */
            st.claim_commands++;
            st.claim_documents += n;
        } else {
            st.insert_commands++;
            st.inserted_documents += n;
        }
        note_write();
        e_i32(b, "n", n);
        ok_field(b);
    } else if (!strcmp(name, "update")) {
        size_t arr = e_arr(b, "upserted");
        upsert_ctx ctx = {b, 0};
        int n = each_doc(body, "updates", docs, upsert_entry, &ctx);
        d_end(b, arr);
        if (!ctx.upserts) { b->len = arr - 1 - strlen("upserted") - 1; }
        st.update_commands++;
        st.update_ops += n;
        st.upserts += ctx.upserts;
        note_write();
        e_i32(b, "n", ctx.upserts);
        e_i32(b, "nModified", 0);
        ok_field(b);
    } else if (!strcmp(name, "delete")) {
        st.delete_commands++;
        st.delete_ops += each_doc(body, "deletes", docs, NULL, NULL);
        e_i32(b, "n", 0);
        ok_field(b);
    } else if (!strcmp(name, "hello") || !strcmp(name, "isMaster") ||
               !strcmp(name, "ismaster")) {
        hello_reply(b, conn_id);
    } else if (!strcmp(name, "ping") || !strcmp(name, "endSessions") ||
               !strcmp(name, "collMod") || !strcmp(name, "drop") ||
               !strcmp(name, "dropDatabase") || !strcmp(name, "dropIndexes") ||
               !strcmp(name, "killCursors")) {
        ok_field(b);
    } else if (!strcmp(name, "buildInfo") || !strcmp(name, "buildinfo")) {
        e_str(b, "version", "7.0.0");
        size_t arr = e_arr(b, "versionArray");
        e_i32(b, "0", 7); e_i32(b, "1", 0); e_i32(b, "2", 0); e_i32(b, "3", 0);
        d_end(b, arr);
        e_i32(b, "maxBsonObjectSize", 16 * 1024 * 1024);
        ok_field(b);
    } else if (!strcmp(name, "create")) {
        create_collection(b, body, db, arg);
    } else if (!strcmp(name, "listCollections")) {
        list_collections(b, body, db);
    } else if (!strcmp(name, "createIndexes")) {
        e_i32(b, "numIndexesBefore", 1);
        e_i32(b, "numIndexesAfter", 2);
        e_bool(b, "createdCollectionAutomatically", 0);
        ok_field(b);
    } else if (!strcmp(name, "find") || !strcmp(name, "aggregate") ||
               !strcmp(name, "listIndexes")) {
        empty_cursor(b, ns);
    } else if (!strcmp(name, "serverStatus")) {
        e_str(b, "host", "fakemongo");
        e_str(b, "version", "7.0.0");
        e_str(b, "process", "fakemongo");
        e_f64(b, "uptime", (double)(now_ns() - started_ns) / 1e9);
        size_t c = e_doc(b, "connections");
        e_i32(b, "current", conns_current);
        e_i64(b, "totalCreated", st.connections_total);
        d_end(b, c);
        size_t f = e_doc(b, "fakemongo");
        stats_doc(b);
        d_end(b, f);
        ok_field(b);
    } else if (!strcmp(name, "fakemongoStats")) {
        stats_doc(b);
        ok_field(b);
    } else if (!strcmp(name, "fakemongoReset")) {
        memset(&st, 0, sizeof st);
        ok_field(b);
    } else {
        fprintf(stderr, "fakemongo: command not answered: %s (database %s)\n", name, db);
        char msg[128];
        snprintf(msg, sizeof msg, "no such command: '%s'", name);
        error_reply(b, 59, "CommandNotFound", msg);
    }
}

typedef struct { int fd; int id; buf_t in, out; size_t out_sent; } conn_t;

static void start_reply(buf_t *out, size_t *hdr, int32_t response_to, int32_t opcode) {
    static int32_t request_id = 1;
    *hdr = out->len;
    b_i32(out, 0);
    b_i32(out, request_id++);
    b_i32(out, response_to);
    b_i32(out, opcode);
}

/* Handle one whole message; 0 if fine, -1 to drop the connection. */
static int handle(conn_t *c, const uint8_t *m, size_t len) {
    int32_t request_id = rd32(m + 4), opcode = rd32(m + 12);
    st.messages++;
    st.bytes_in += (int64_t)len;
    size_t hdr;
    if (opcode == OP_MSG) {
        st.op_msgs++;
        uint32_t flags;
        memcpy(&flags, m + 16, 4);
        size_t end = len - ((flags & 1) ? 4 : 0), off = 20;
        const uint8_t *body = NULL;
        docs_t docs = {NULL, 0};
        while (off < end) {
            uint8_t kind = m[off++];
            if (kind == 0) {
                if (!doc_valid(m + off, end - off)) return -1;
                body = m + off;
                off += (size_t)rd32(m + off);
            } else if (kind == 1) {
                if (end - off < 4) return -1;
                size_t size = (size_t)rd32(m + off);
                if (size < 5 || off + size > end) return -1;
                size_t idlen = strnlen((const char *)m + off + 4, size - 4);
                if (4 + idlen + 1 > size) return -1;
                docs.seq = m + off + 4 + idlen + 1;
                docs.len = size - 4 - idlen - 1;
                off += size;
            } else {
                return -1;
            }
        }
        if (!body) return -1;
        elem_t dbe;
        const char *db = find_elem(body, "$db", &dbe) && dbe.type == 0x02
                             ? (const char *)dbe.val + 4 : "admin";
        buf_t reply = {0};
        size_t at = d_begin(&reply);
        command(&reply, body, db, &docs, c->id);
        d_end(&reply, at);
        if (flags & 2) { free(reply.p); return 0; }  /* moreToCome: no reply */
        start_reply(&c->out, &hdr, request_id, OP_MSG);
        b_i32(&c->out, 0);
        b_u8(&c->out, 0);
        b_put(&c->out, reply.p, reply.len);
        free(reply.p);
    } else if (opcode == OP_QUERY) {
        st.op_queries++;
        size_t off = 20;
        const char *ns = (const char *)m + off;
        size_t nslen = strnlen(ns, len - off);
        off += nslen + 1 + 8;
        if (off > len || !doc_valid(m + off, len - off)) return -1;
        const uint8_t *query = m + off;
        elem_t inner;
        if (find_elem(query, "$query", &inner) && inner.type == 0x03) query = inner.val;
        char db[128];
        snprintf(db, sizeof db, "%.*s", (int)strcspn(ns, "."), ns);
        docs_t docs = {NULL, 0};
        buf_t reply = {0};
        size_t at = d_begin(&reply);
        command(&reply, query, db, &docs, c->id);
        d_end(&reply, at);
        start_reply(&c->out, &hdr, request_id, OP_REPLY);
        b_i32(&c->out, 0);
        b_i64(&c->out, 0);
        b_i32(&c->out, 0);
        b_i32(&c->out, 1);
        b_put(&c->out, reply.p, reply.len);
        free(reply.p);
    } else {
        fprintf(stderr, "fakemongo: opcode %d not supported; closing the connection\n", opcode);
        return -1;
    }
    b_set32(&c->out, hdr, (int32_t)(c->out.len - hdr));
    return 0;
}

/* Process every whole message in the input buffer, then try to send the replies. */
static int serve(conn_t *c) {
    size_t off = 0;
    while (c->in.len - off >= 16) {
        int32_t len = rd32(c->in.p + off);
        if (len < 16 || len > MAX_MESSAGE + 1024) return -1;
        if (c->in.len - off < (size_t)len) break;
        if (handle(c, c->in.p + off, (size_t)len) < 0) return -1;
        off += (size_t)len;
    }
    memmove(c->in.p, c->in.p + off, c->in.len - off);
    c->in.len -= off;
    while (c->out_sent < c->out.len) {
        ssize_t n = send(c->fd, c->out.p + c->out_sent, c->out.len - c->out_sent, MSG_NOSIGNAL);
        if (n < 0) return (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
        c->out_sent += (size_t)n;
    }
    c->out.len = c->out_sent = 0;
    return 0;
}

static volatile sig_atomic_t stopping;
static void on_signal(int sig) { (void)sig; stopping = 1; }

int main(int argc, char **argv) {
    int port = 0, opt;
    while ((opt = getopt(argc, argv, "p:v")) != -1) {
        if (opt == 'p') port = atoi(argv[optind - 1]);
        else if (opt == 'v') verbose = 1;
        else { fprintf(stderr, "usage: fakemongo [-p PORT] [-v]\n"); return 2; }
    }
    started_ns = now_ns();
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(lfd, 64) < 0) {
        fprintf(stderr, "fakemongo: cannot listen on 127.0.0.1:%d: %s\n", port, strerror(errno));
        return 1;
    }
    socklen_t alen = sizeof addr;
    getsockname(lfd, (struct sockaddr *)&addr, &alen);
    printf("mongodb://127.0.0.1:%d\n", ntohs(addr.sin_port));
    fflush(stdout);
    static conn_t conns[MAX_CONNS];
    struct pollfd fds[MAX_CONNS + 1];
    int nconns = 0, next_id = 1;
    uint8_t chunk[65536];
    while (!stopping) {
        fds[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
        for (int i = 0; i < nconns; i++)
            fds[i + 1] = (struct pollfd){.fd = conns[i].fd,
                                         .events = POLLIN | (conns[i].out.len ? POLLOUT : 0)};
        if (poll(fds, (nfds_t)nconns + 1, -1) < 0) {
            if (errno == EINTR) continue;
            perror("fakemongo: poll");
            return 1;
        }
        for (int i = nconns - 1; i >= 0; i--) {
            conn_t *c = &conns[i];
            int bad = 0;
            if (fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) {
                ssize_t n = recv(c->fd, chunk, sizeof chunk, 0);
                if (n > 0) b_put(&c->in, chunk, (size_t)n);
                else if (n == 0 || (errno != EAGAIN && errno != EINTR)) bad = 1;
            }
            if (!bad && serve(c) < 0) bad = 1;
            if (bad) {
                close(c->fd);
                free(c->in.p);
                free(c->out.p);
                conns[i] = conns[--nconns];
                conns_current = nconns;
            }
        }
        if (fds[0].revents & POLLIN) {
            int fd = accept(lfd, NULL, NULL);
            if (fd < 0) continue;
            if (nconns == MAX_CONNS) { close(fd); continue; }
            fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            conns[nconns++] = (conn_t){.fd = fd, .id = next_id++};
            conns_current = nconns;
            st.connections_total++;
        }
    }
    print_stats_json(stdout);
    return 0;
}
