/* A growing list of chat messages owned by the tool (strings strdup'd). */
#ifndef LMX_TOOLS_MESSAGES_H
#define LMX_TOOLS_MESSAGES_H

#include "lmx.h"

typedef struct messages {
    lmx_message *items;
    int n, cap;
} messages;

/* Appends a copy of role and content; -1 when out of memory. */
int messages_add(messages *ms, const char *role, const char *content);
/* Drops messages from index `from` on. */
void messages_truncate(messages *ms, int from);
void messages_free(messages *ms);
/* Reads a JSON file: an array of {"role", "content"} objects, or an object
 * with such an array under "messages". Prints what is wrong and returns -1. */
int messages_load_json(messages *ms, const char *path);

#endif
