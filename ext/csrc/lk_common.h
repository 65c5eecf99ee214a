/* Shared status codes of the native core. Every public C function returns one
 * of these; the Cython binding maps them to Python exceptions, so no failure
 * inside ext/ can abort the interpreter. */
#ifndef LK_COMMON_H
#define LK_COMMON_H

#include <stdint.h>

#define LK_OK 0
#define LK_ENOMEM (-1)     /* malloc failed */
#define LK_EBADTOKEN (-2)  /* a token < -1; its index is reported through *bad_index */
#define LK_ECAPACITY (-3)  /* a ContinuationTrie would exceed its node capacity */
#define LK_EBADARG (-4)    /* an argument outside what the routine takes (its header says which) */
#define LK_ERANGE (-5)     /* a value the output's format cannot hold (its header says which) */

#define LK_SEP (-1)  /* document separator: sorts below every token, never matched across */

#endif
