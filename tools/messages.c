#include "messages.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int messages_add(messages *ms, const char *role, const char *content)
{
    if (ms->n == ms->cap) {
        int cap = ms->cap ? ms->cap * 2 : 8;
        lmx_message *g = realloc(ms->items, (size_t)cap * sizeof *g);
        if (!g)
            return -1;
        ms->items = g;
        ms->cap = cap;
    }
    char *r = strdup(role), *c = strdup(content);
    if (!r || !c) {
        free(r);
        free(c);
        return -1;
    }
    ms->items[ms->n++] = (lmx_message){r, c};
    return 0;
}

void messages_truncate(messages *ms, int from)
{
    for (int i = from; i < ms->n; i++) {
        free((char *)ms->items[i].role);
        free((char *)ms->items[i].content);
    }
    if (from < ms->n)
        ms->n = from;
}

void messages_free(messages *ms)
{
    messages_truncate(ms, 0);
    free(ms->items);
    memset(ms, 0, sizeof *ms);
}

int messages_load_json(messages *ms, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "lmx: cannot open %s\n", path);
        return -1;
    }
    size_t cap = 1 << 16, len = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0)
        if ((len += got) == cap) {
            char *g = realloc(buf, cap *= 2);
            if (!g)
                free(buf);
            buf = g;
        }
    fclose(f);
    cJSON *root = buf ? cJSON_ParseWithLength(buf, len) : NULL;
    free(buf);
    const cJSON *arr = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "messages") : root;
    int rc = 0;
    if (!cJSON_IsArray(arr)) {
        fprintf(stderr, "lmx: %s: expected a JSON array of {\"role\", \"content\"} messages\n", path);
        rc = -1;
    }
    for (int i = 0; rc == 0 && i < cJSON_GetArraySize(arr); i++) {
        const cJSON *m = cJSON_GetArrayItem(arr, i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(role) || !cJSON_IsString(content)) {
            fprintf(stderr, "lmx: %s: message %d needs string \"role\" and \"content\"\n", path, i);
            rc = -1;
        } else if (messages_add(ms, role->valuestring, content->valuestring)) {
            fprintf(stderr, "lmx: out of memory\n");
            rc = -1;
        }
    }
    cJSON_Delete(root);
    return rc;
}
