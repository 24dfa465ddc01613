/*
 * minitron_int.h - the Minitron arm's hybrid grid (minitron_hybrid.c),
 * which ac_search_minitron runs for a nemotron_h base.
 */
#ifndef AC_MINITRON_INT_H
#define AC_MINITRON_INT_H

#include "search/search.h"

int ac_minitron_hybrid(const ac_search_problem *p, ac_search_result *r, ac_err *e);

#endif
