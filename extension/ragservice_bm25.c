/*
 * ragservice_bm25: the exact top k of BM25 over ragservice's postings blocks, with block-max
 * pruning (the blocks' max_tf and min_len bound every score inside them).
 *
 * `chunk_postings` holds, per (collection, lexeme, impact tier), blocks of up to 128 postings
 * (seqs, tfs, lengths), each with the seq range it covers and the largest tf and smallest
 * length in it (migrations 0014, 0020). A posting's BM25 part,
 *     w * idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avgdl)),
 * grows with tf and shrinks with len (k1 >= 0, 0 <= b <= 1, w * idf >= 0), so
 * part(max_tf, min_len) bounds every posting of a block.
 *
 * The search:
 *   1. reads the bounds of every block of the query's terms (from the primary key's index
 *      alone) and the collections' totals (N, average length); df is the sum of a term's
 *      blocks' sizes, as in the SQL path;
 *   2. reads blocks from the highest bound down, in rounds that double, adding each posting to
 *      its chunk's partial score (a lower bound of its final score). After each round, theta is
 *      the k-th best partial score, and (MaxScore) the terms whose highest unread bounds add up
 *      to less than theta are not essential: a chunk found only in them cannot reach the top k,
 *      so only the essential terms' blocks are read on, until no term is essential;
 *   3. keeps the seen chunks that still could (partial score plus the highest unread bound of
 *      each term not yet seen in the chunk >= theta) and, again from the highest bound down in
 *      rounds, reads only the unread blocks whose seq range holds one of them, which completes
 *      their scores exactly (theta rises and the bounds fall as it goes, so fewer stay);
 *   4. returns the chunks scoring at least the k-th best (ties at the cut included).
 * Every chunk in BM25's exact top k is returned, with its exact score.
 *
 * The exhaustive scan: when the pruning does not pay (a 128th of the postings read in phase 2
 * without finishing, or phase 3 wanting a quarter of them; on queries whose terms hold at least
 * ragservice_bm25.exhaustive_min_postings), or the parameters do not allow the bounds (k1 < 0,
 * b outside [0, 1], a negative weight), every block of the terms is read in one scan of the
 * primary key and each posting added to a dense array of scores over the seq range: about
 * 7 ns a posting against 50 for the pruning's partial scores, and no block looked up by key.
 * A large collection's natural-language queries mostly go this way: their many common terms
 * leave the bounds far above the k-th score (docs/benchmarks.md).
 *
 * Blocks are read in place: the rows of the blocks queries go to a receiver that reads their
 * arrays in the scan's buffer (no copy); a batch of more than LOOKUP_BLOCKS_MAX blocks is read
 * by one scan of the primary key with an array per key column, not one lookup a block.
 *
 * The tables (public.chunk_postings, public.collection_text_stats: never a temporary table of
 * the same name) are read through SPI as the caller: row-level security and grants apply as to
 * any statement of the caller's.
 */
#include "postgres.h"

#include <math.h>

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/pg_bitutils.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "catalog/namespace.h"
#include "utils/guc.h"
#include "nodes/params.h"
#include "tcop/dest.h"
#include "utils/memutils.h"
#include "utils/tuplestore.h"
#include "utils/uuid.h"

PG_MODULE_MAGIC;

/* ragservice_bm25.accumulator: how the partial scores are kept (auto: by the seq range). */
typedef enum AccumulatorChoice
{
	ACCUMULATOR_AUTO,
	ACCUMULATOR_HASH,
	ACCUMULATOR_ARRAY
} AccumulatorChoice;

static const struct config_enum_entry accumulator_options[] = {
	{"auto", ACCUMULATOR_AUTO, false},
	{"hash", ACCUMULATOR_HASH, false},
	{"array", ACCUMULATOR_ARRAY, false},
	{NULL, 0, false}
};

static int	accumulator_choice = ACCUMULATOR_AUTO;

/*
 * ragservice_bm25.exhaustive_min_postings: a query whose terms hold at least this many postings
 * may give up the pruning for the exhaustive scan (see ragservice_bm25_topk); below it, both
 * take a millisecond or two and the pruning carries on.
 */
static int	exhaustive_min_postings = 65536;

void		_PG_init(void);

void
_PG_init(void)
{
	DefineCustomEnumVariable("ragservice_bm25.accumulator",
							 "How ragservice_bm25_topk keeps partial scores.",
							 "auto: an array over the seq range when it is dense enough, else a "
							 "hash; array: the array whenever the range allows it; hash: always "
							 "the hash.",
							 &accumulator_choice, ACCUMULATOR_AUTO, accumulator_options,
							 PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("ragservice_bm25.exhaustive_min_postings",
							"The fewest postings in a query's terms for which ragservice_bm25_topk "
							"may give up the pruning for one exhaustive scan.",
							"Once the pruning has read a 128th of the postings without finishing, "
							"the scan reads them all at a fraction of the cost each. 0: any query.",
							&exhaustive_min_postings, 65536, 0, INT_MAX,
							PGC_USERSET, 0, NULL, NULL, NULL);
	MarkGUCPrefixReserved("ragservice_bm25");
}

PG_FUNCTION_INFO_V1(ragservice_bm25_topk);
PG_FUNCTION_INFO_V1(ragservice_bm25_topk_in);
PG_FUNCTION_INFO_V1(ragservice_bm25_last_stats);

/*
 * A chunk's partial score, and the terms (the first 32) whose posting it has been seen in; 24
 * bytes, so that a million of them stay in a large last-level cache.
 */
typedef struct Accum
{
	int64		seq;
	double		score;
	uint32		seen;
	uint16		round;			/* the last phase-2 round that added to it */
	bool		live;
	char		status;
} Accum;

#define SEEN_TERMS 32
#define SEEN_BIT(t) ((t) < SEEN_TERMS ? (uint32) 1 << (t) : 0)

/* splitmix64's finalizer: seqs are dense integers, their low bits alone hash badly */
static inline uint32
seq_hash(int64 seq)
{
	uint64		h = (uint64) seq;

	h ^= h >> 30;
	h *= UINT64CONST(0xbf58476d1ce4e5b9);
	h ^= h >> 27;
	h *= UINT64CONST(0x94d049bb133111eb);
	h ^= h >> 31;
	return (uint32) h;
}

/*
 * simplehash grows a table of its own accord, below its fill factor's threshold, when an
 * insertion probes or shifts far (SH_GROW_MAX_DIB, SH_GROW_MAX_MOVE) once the table is a tenth
 * full: growth no budget check sees, which at 0.9 full happens again and again (a window's
 * table of 786 kB grew to 50 MB, with work_mem at 1 MB). The tables here grow only at their
 * threshold, which their callers check against the budget before they insert: a long probe
 * costs time, never memory. They are filled to 0.8 (not simplehash's 0.9), where robin hood's
 * probes and shifts stay short.
 */
#define TABLE_GROWS_ONLY_WHEN_FULL 2.0
#define TABLE_FILL 0.8

#define SH_PREFIX acc
#define SH_ELEMENT_TYPE Accum
#define SH_GROW_MIN_FILLFACTOR TABLE_GROWS_ONLY_WHEN_FULL
#define SH_FILLFACTOR TABLE_FILL
#define SH_KEY_TYPE int64
#define SH_KEY seq
#define SH_HASH_KEY(tb, key) seq_hash(key)
#define SH_EQUAL(tb, a, b) ((a) == (b))
#define SH_SCOPE static inline
#define SH_DECLARE
#define SH_DEFINE
#include "lib/simplehash.h"

/*
 * The chunks' partial scores: a direct-mapped array over the seq range of the blocks when it is
 * dense enough (postings of one block sit next to each other, and nothing is hashed), else a
 * hash. Both live in the memory context of the call's pruning (sized against work_mem).
 */
typedef struct Accumulator
{
	acc_hash   *hash;			/* sparse; NULL when dense */
	Accum	   *slots;			/* dense: slots[seq - base], status 1 when present */
	int64		base;
	int64		range;
	Accum	  **members;		/* dense: the present slots, in the order they came */
	uint32		nmembers;
	uint32		capacity;
	uint64	   *live_bits;		/* phase 3: a bit per seq from base, set for the live chunks */
} Accumulator;

typedef struct AccumIterator
{
	acc_iterator hash_it;
	uint32		next;
} AccumIterator;

/* The widest seq range worth an array: 24 bytes a slot, 96 MB at most, 4 slots a posting. */
#define DENSE_MAX_RANGE (INT64CONST(1) << 22)
#define DENSE_SLOTS_PER_POSTING 4

/*
 * One call's memory: work_mem. The pruning's partial scores and block lists, the exhaustive
 * scan's arrays and the results are allocated in memory contexts of the call and sized against
 * it; what would not fit goes the windowed scan (score_in_windows), which fits by construction.
 */
static inline size_t
call_budget(void)
{
	return (size_t) work_mem * 1024;
}

/* A bounds row's memory, about: its block, its place in a batch, SPI's copy of the row. */
#define BOUNDS_ROW_BYTES 192

/* A block's postings at most (the writers cut blocks of 128). */
#define MAX_BLOCK_POSTINGS 128

/* last - first as an unsigned width (the number of seqs in [first, last] less one). */
static inline uint64
seq_span(int64 first_seq, int64 last_seq)
{
	return (uint64) last_seq - (uint64) first_seq;
}

/* `bytes` of zeroes in the current memory context; NULL when the memory is not there. */
static void *
allocate_zeroed(size_t bytes)
{
	return palloc_extended(bytes, MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO | MCXT_ALLOC_NO_OOM);
}

static void
posting_out_of_range(int64 seq, int64 first_seq, int64 last_seq)
{
	ereport(ERROR,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("ragservice_bm25: a posting (seq %lld) outside the seq range [%lld, %lld] "
					"of its terms' blocks", (long long) seq, (long long) first_seq,
					(long long) last_seq)));
}

static Accumulator *
accum_create(int64 first_seq, int64 last_seq, int64 postings, size_t budget)
{
	Accumulator *a = palloc0(sizeof(Accumulator));
	uint64		span = seq_span(first_seq, last_seq);
	int64		range = span < (uint64) PG_INT64_MAX ? (int64) span + 1 : PG_INT64_MAX;
	int64		entries;

	a->base = first_seq;
	a->range = range;

	/* the array and its members' list, 32 bytes a seq at most */
	if (postings > 0 && range <= DENSE_MAX_RANGE
		&& (size_t) range * (sizeof(Accum) + sizeof(Accum *)) <= budget
		&& accumulator_choice != ACCUMULATOR_HASH
		&& (accumulator_choice == ACCUMULATOR_ARRAY || range <= DENSE_SLOTS_PER_POSTING * postings))
		a->slots = allocate_zeroed(sizeof(Accum) * (size_t) range);
	if (a->slots != NULL)
	{
		a->capacity = (uint32) Min(Max(postings / 2, 1024), range);
		a->members = palloc_extended(sizeof(Accum *) * a->capacity, MCXT_ALLOC_HUGE);
		return a;
	}

	/*
	 * Sized for half the postings up front (at most 1M chunks, and a quarter of the budget): a
	 * query that reads most of them rehashes once at most as it fills, one that prunes does not
	 * zero much it never uses.
	 */
	entries = Min(Max(postings / 2, 1024), INT64CONST(1) << 20);
	entries = Min(entries, (int64) (budget / 4 / sizeof(Accum)));
	a->hash = acc_create(CurrentMemoryContext, (uint32) Max(entries, 16), NULL);
	return a;
}

static inline uint32
accum_count(const Accumulator *a)
{
	return a->hash != NULL ? a->hash->members : a->nmembers;
}

/* The chunk's entry, entered (zero) if new. */
static inline Accum *
accum_upsert(Accumulator *a, int64 seq)
{
	Accum	   *e;
	bool		found;

	if (a->hash != NULL)
	{
		e = acc_insert(a->hash, seq, &found);
		if (found)
			return e;
	}
	else
	{
		uint64		off = (uint64) seq - (uint64) a->base;

		if (off >= (uint64) a->range)
			posting_out_of_range(seq, a->base, a->base + (a->range - 1));
		e = &a->slots[off];
		if (e->status != 0)
			return e;
		e->status = 1;
		e->seq = seq;
		if (a->nmembers == a->capacity)
		{
			a->capacity = (uint32) Min((int64) a->capacity * 2, a->range);
			a->members = repalloc_huge(a->members, sizeof(Accum *) * a->capacity);
		}
		a->members[a->nmembers++] = e;
	}
	e->score = 0;
	e->seen = 0;
	e->round = 0;
	e->live = true;
	return e;
}

static inline Accum *
accum_find(Accumulator *a, int64 seq)
{
	Accum	   *e;

	if (a->hash != NULL)
		return acc_lookup(a->hash, seq);
	if ((uint64) seq - (uint64) a->base >= (uint64) a->range)
		return NULL;
	e = &a->slots[(uint64) seq - (uint64) a->base];
	return e->status != 0 ? e : NULL;
}

/* The set bits of a bitmap, in order (see bit_walk_next). */
typedef struct BitWalk
{
	const uint64 *words;
	int64		nwords;
	int64		word;			/* the word `rest` came from */
	uint64		rest;			/* its bits not yet returned */
} BitWalk;

static inline BitWalk
bit_walk(const uint64 *words, int64 nbits)
{
	return (BitWalk) {words, (nbits + 63) / 64, -1, 0};
}

/* The next set bit's offset into *off; false after the last. */
static inline bool
bit_walk_next(BitWalk *w, int64 *off)
{
	while (w->rest == 0)
	{
		if (++w->word >= w->nwords)
			return false;
		w->rest = w->words[w->word];
	}
	*off = w->word * 64 + pg_rightmost_one_pos64(w->rest);
	w->rest &= w->rest - 1;
	return true;
}

/* The widest seq range given a bitmap of the live chunks in phase 3: 16 MB of bits. */
#define LIVE_BITS_MAX_RANGE (INT64CONST(1) << 27)

static inline bool
live_bit(const Accumulator *a, int64 seq)
{
	uint64		off = (uint64) seq - (uint64) a->base;

	return off < (uint64) a->range
		&& (a->live_bits[off >> 6] & (UINT64CONST(1) << (off & 63))) != 0;
}

static inline void
set_live_bit(Accumulator *a, int64 seq, bool live)
{
	uint64		off = (uint64) seq - (uint64) a->base;
	uint64		mask = UINT64CONST(1) << (off & 63);

	if (off >= (uint64) a->range)
		posting_out_of_range(seq, a->base, a->base + (a->range - 1));
	if (live)
		a->live_bits[off >> 6] |= mask;
	else
		a->live_bits[off >> 6] &= ~mask;
}

static inline void
accum_start(Accumulator *a, AccumIterator *it)
{
	memset(it, 0, sizeof(AccumIterator));
	if (a->hash != NULL)
		acc_start_iterate(a->hash, &it->hash_it);
	it->next = 0;
}

static inline Accum *
accum_next(Accumulator *a, AccumIterator *it)
{
	if (a->hash != NULL)
		return acc_iterate(a->hash, &it->hash_it);
	return it->next < a->nmembers ? a->members[it->next++] : NULL;
}

typedef struct Term
{
	const char *lexeme;
	int			length;
	Datum		text;			/* the lexeme as a text datum */
	double		weight;
	double		df;
	double		idf_weight;		/* weight * idf */
	double		unread_bound;	/* the highest bound among its unread blocks */
	bool		essential;		/* its unread blocks may hold a chunk of the top k not seen yet */
} Term;

typedef struct PostingsBlock
{
	pg_uuid_t	collection;
	int			term;
	int16		tier;
	int64		first_seq;
	int64		last_seq;
	int32		n;
	int16		max_tf;
	int32		min_len;
	double		bound;
	bool		read;
} PostingsBlock;

typedef struct Scoring
{
	double		k1;
	double		b;
	double		avgdl;
	double		flat;			/* k1 * (1 - b), see set_length_norm */
	double		per_length;		/* k1 * b / avgdl */
} Scoring;

typedef struct Stats
{
	int64		blocks;
	int64		blocks_read;
	int64		postings_read;
	int32		rounds;
} Stats;

static Stats last_stats;

/*
 * With DEBUG1 messages wanted (client_min_messages or log_min_messages), a call reports how far
 * the backend's memory in contexts (all of them: the call's, SPI's, the executor's, the caches')
 * rose above its level at the call's start, at its highest: sampled at every row of every query
 * the call runs, and wherever the call's own allocations peak. Otherwise nothing is sampled.
 */
typedef struct MemoryPeak
{
	bool		tracked;
	Size		start;
	Size		peak;
} MemoryPeak;

static MemoryPeak memory_peak;

static inline void
note_memory(void)
{
	if (memory_peak.tracked)
	{
		Size		now = MemoryContextMemAllocated(TopMemoryContext, true);

		if (now > memory_peak.peak)
			memory_peak.peak = now;
	}
}

/*
 * Theta's candidates in phase 2: the chunks a round added to (each once) and the top k after
 * the round before. A chunk in neither kept its score, which was at most the old k-th best.
 */
typedef struct Leaders
{
	int64	   *touched;
	int			ntouched;
	int			capacity;
	int64	   *top;
	int			ntop;
	uint16		round;
} Leaders;

typedef struct ScoredSeq
{
	double		score;
	int64		seq;
} ScoredSeq;

#define FIRST_ROUND 16
#define MAX_K 100000
/* Relative slack on every pruning comparison: sums in another order may differ by an ulp. */
#define SLACK 1e-9

/*
 * The blocks of a batch, by key. Few blocks: one primary-key lookup each (a nested loop over the
 * keys). Many: one scan of the primary key with an array per key column (the index skips from
 * key to key within one descent), which returns a superset (the arrays' cross product) that
 * read_blocks filters; from a few hundred blocks on it costs a third or less a block.
 */
#define LOOKUP_BLOCKS_MAX 256

static const char *BLOCKS_BY_LOOKUP =
	"SELECT p.collection_id, p.lexeme, p.tier, p.first_seq, p.last_seq, p.n, p.seqs, p.tfs, "
	"       p.lengths "
	"FROM unnest($1::uuid[], $2::text[], $3::int2[], $4::int8[]) "
	"     AS k(collection_id, lexeme, tier, first_seq) "
	"CROSS JOIN LATERAL (SELECT p.* FROM %s p "
	"                    WHERE p.collection_id = k.collection_id AND p.lexeme = k.lexeme "
	"                      AND p.tier = k.tier AND p.first_seq = k.first_seq OFFSET 0) AS p";

static const char *BLOCKS_BY_SCAN =
	"SELECT p.collection_id, p.lexeme, p.tier, p.first_seq, p.last_seq, p.n, p.seqs, p.tfs, "
	"       p.lengths "
	"FROM %s p "
	"WHERE p.collection_id = ANY($1) AND p.lexeme = ANY($2) AND p.tier = ANY($3) "
	"  AND p.first_seq = ANY($4)";

/* Every block of the terms that holds seqs in [$3, $4] (the exhaustive path, by windows). */
static const char *BLOCKS_IN_WINDOW =
	"SELECT p.collection_id, p.lexeme, p.tier, p.first_seq, p.last_seq, p.n, p.seqs, p.tfs, "
	"       p.lengths "
	"FROM %s p WHERE p.collection_id = ANY($1) AND p.lexeme = ANY($2) "
	"  AND p.first_seq <= $4 AND p.last_seq >= $3";

/* The terms' document frequencies and seq range, when their blocks are too many to list. */
static const char *TERM_TOTALS =
	"SELECT p.lexeme, coalesce(sum(p.n), 0)::float8, min(p.first_seq), max(p.last_seq), "
	"       count(*), count(*) FILTER (WHERE p.first_seq IS NULL OR p.last_seq IS NULL "
	"           OR p.n IS NULL OR p.max_tf IS NULL OR p.min_len IS NULL OR p.n < 0 "
	"           OR p.n > 128 OR p.first_seq > p.last_seq) "
	"FROM %s p WHERE p.collection_id = ANY($1) AND p.lexeme = ANY($2) "
	"GROUP BY p.lexeme";

/*
 * The tables the call reads, quoted and qualified: public.chunk_postings and
 * public.collection_text_stats, or (ragservice_bm25_topk_in) a Citus shard of each.
 */
static const char *postings_table = "public.chunk_postings";
static const char *stats_table = "public.collection_text_stats";

/* A statement of the call, with its postings table in place of the template's %s. */
static char *
on_postings(const char *template)
{
	return psprintf(template, postings_table);
}

/*
 * The exhaustive path keeps a score (8 bytes) and a bit a slot over the seq range: worth it up
 * to 8 slots a posting (at most 32 MB of scores).
 */
#define EXHAUSTIVE_MAX_RANGE (INT64CONST(1) << 22)
#define EXHAUSTIVE_SLOTS_PER_POSTING 8

/* The two prepared statements that read blocks. */
typedef struct BlockReader
{
	SPIPlanPtr	by_lookup;
	SPIPlanPtr	by_scan;
} BlockReader;

/* BM25's length normalisation as two coefficients, once k1, b and avgdl are known. */
static void
set_length_norm(Scoring *s)
{
	s->flat = s->k1 * (1 - s->b);
	s->per_length = s->k1 * s->b / s->avgdl;
}

/* A posting's BM25 part before idf: tf (k1 + 1) / (tf + k1 (1 - b + b len / avgdl)). */
static inline double
term_part(const Scoring *s, double tf, double len)
{
	return tf * (s->k1 + 1) / (tf + s->flat + s->per_length * len);
}

static int
compare_bound_desc(const void *a, const void *b)
{
	double		x = ((const PostingsBlock *) a)->bound;
	double		y = ((const PostingsBlock *) b)->bound;

	return (x < y) - (x > y);
}

/* sort_live(Accum **, size_t): by seq, with the comparison inlined */
typedef Accum *AccumPointer;

#define ST_SORT sort_live
#define ST_ELEMENT_TYPE AccumPointer
#define ST_COMPARE(a, b) (((*(a))->seq > (*(b))->seq) - ((*(a))->seq < (*(b))->seq))
#define ST_SCOPE static
#define ST_DEFINE
#include "lib/sort_template.h"

/* Offers (score, seq) to a min-heap (by score) of the k best. */
static void
heap_offer_scored(ScoredSeq *heap, int *size, int k, ScoredSeq v)
{
	int			i;

	if (*size < k)
	{
		i = (*size)++;
		while (i > 0 && heap[(i - 1) / 2].score > v.score)
		{
			heap[i] = heap[(i - 1) / 2];
			i = (i - 1) / 2;
		}
		heap[i] = v;
		return;
	}
	if (v.score <= heap[0].score)
		return;
	i = 0;
	for (;;)
	{
		int			c = 2 * i + 1;

		if (c >= *size)
			break;
		if (c + 1 < *size && heap[c + 1].score < heap[c].score)
			c++;
		if (heap[c].score >= v.score)
			break;
		heap[i] = heap[c];
		i = c;
	}
	heap[i] = v;
}

/* The k-th largest score (k >= 1) of the chunks (the live ones), or -infinity if fewer. */
static double
kth_largest(Accumulator *acc, int k, bool live_only)
{
	ScoredSeq  *heap = palloc(sizeof(ScoredSeq) * k);
	int			size = 0;
	double		result;
	AccumIterator it;
	Accum	   *e;

	accum_start(acc, &it);
	while ((e = accum_next(acc, &it)) != NULL)
		if (!live_only || e->live)
			heap_offer_scored(heap, &size, k, (ScoredSeq) {e->score, e->seq});
	result = size < k ? -INFINITY : heap[0].score;
	pfree(heap);
	return result;
}

static double
kth_largest_of(Accum **items, int count, int k)
{
	ScoredSeq  *heap = palloc(sizeof(ScoredSeq) * k);
	int			size = 0;
	double		result;
	int			i;

	for (i = 0; i < count; i++)
		heap_offer_scored(heap, &size, k, (ScoredSeq) {items[i]->score, items[i]->seq});
	result = size < k ? -INFINITY : heap[0].score;
	pfree(heap);
	return result;
}

/*
 * Theta after a phase-2 round: the k-th best partial score (-infinity if fewer than k chunks),
 * from the round's leaders alone; they become the next round's top.
 */
static double
round_theta(Accumulator *acc, Leaders *leaders, int k)
{
	ScoredSeq  *heap = palloc(sizeof(ScoredSeq) * k);
	int			size = 0;
	double		theta;
	int			i;

	for (i = 0; i < leaders->ntouched; i++)
	{
		Accum	   *e = accum_find(acc, leaders->touched[i]);
		ScoredSeq	v;

		if (e == NULL)
			elog(ERROR, "ragservice_bm25: a chunk lost from the partial scores");
		v = (ScoredSeq) {e->score, e->seq};
		heap_offer_scored(heap, &size, k, v);
	}
	for (i = 0; i < leaders->ntop; i++)
	{
		Accum	   *e = accum_find(acc, leaders->top[i]);
		ScoredSeq	v;

		if (e == NULL)
			elog(ERROR, "ragservice_bm25: a chunk lost from the partial scores");
		v = (ScoredSeq) {e->score, e->seq};
		if (e->round != leaders->round)
			heap_offer_scored(heap, &size, k, v);
	}
	theta = size < k ? -INFINITY : heap[0].score;
	for (i = 0; i < size; i++)
		leaders->top[i] = heap[i].seq;
	leaders->ntop = size;
	leaders->ntouched = 0;
	leaders->round++;
	pfree(heap);
	return theta;
}

/* Each term's highest bound among the unread blocks (blocks are sorted by bound, highest first). */
static double
unread_bounds(Term *terms, int nterms, const PostingsBlock *blocks, int nblocks)
{
	int			found = 0;
	double		sum = 0;
	int			t;
	int			i;

	for (t = 0; t < nterms; t++)
		terms[t].unread_bound = -1;
	for (i = 0; i < nblocks && found < nterms; i++)
	{
		if (blocks[i].read || terms[blocks[i].term].unread_bound >= 0)
			continue;
		terms[blocks[i].term].unread_bound = blocks[i].bound;
		found++;
	}
	for (t = 0; t < nterms; t++)
	{
		if (terms[t].unread_bound < 0)
			terms[t].unread_bound = 0;
		sum += terms[t].unread_bound;
	}
	return sum;
}

static int
compare_unread_bound(const void *a, const void *b)
{
	double		x = (*(Term *const *) a)->unread_bound;
	double		y = (*(Term *const *) b)->unread_bound;

	return (x > y) - (x < y);
}

/*
 * MaxScore's split: the terms with the lowest unread bounds, as many as add up to less than
 * theta, are not essential; returns how many terms are.
 */
static int
mark_essential_terms(Term *terms, int nterms, double theta)
{
	Term	  **order = palloc(sizeof(Term *) * nterms);
	double		sum = 0;
	int			essential = 0;
	int			i;

	for (i = 0; i < nterms; i++)
		order[i] = &terms[i];
	qsort(order, nterms, sizeof(Term *), compare_unread_bound);
	for (i = 0; i < nterms; i++)
	{
		sum += order[i]->unread_bound;
		order[i]->essential = sum >= theta - SLACK * theta;
		if (order[i]->essential)
			essential++;
	}
	pfree(order);
	return essential;
}

/*
 * A row of a blocks query, its key and its postings (read in place, in the scan's buffer, for
 * as long as the row is handled).
 */
typedef struct BlockRow
{
	int			term;
	const pg_uuid_t *collection;
	int16		tier;
	int64		first_seq;
	int64		last_seq;
	int			n;
	const int64 *seqs;
	const int16 *tfs;
	const int32 *lengths;
} BlockRow;

/* The memory a part of the call may take: what its context holds, against a limit. */
typedef struct Budget
{
	MemoryContext context;
	size_t		limit;
	bool		exceeded;
} Budget;

static inline size_t
budget_used(const Budget *budget)
{
	return MemoryContextMemAllocated(budget->context, true);
}

/*
 * Whether `more` bytes fit beside what the budget's context holds; false (and the budget marked
 * exceeded) when they do not.
 */
static bool
budget_allows(Budget *budget, size_t more)
{
	if (budget_used(budget) + more <= budget->limit)
		return true;
	budget->exceeded = true;
	return false;
}

/*
 * Adds a block's postings to the chunks' scores; see read_blocks. False, having added nothing,
 * when new chunks' entries could take the pruning over its budget.
 */
static bool
add_block_postings(const BlockRow *row, const Term *terms, const Scoring *scoring,
				   Accumulator *acc, Leaders *leaders, Budget *budget)
{
	const Term *term = &terms[row->term];
	int			n = row->n;
	const int64 *seq = row->seqs;
	const int16 *tf = row->tfs;
	const int32 *len = row->lengths;
	uint32		bit = SEEN_BIT(row->term);
	int			j;

	if (leaders != NULL)
	{
		/* what the row's new chunks may make grow: the hash (doubling), the lists (doubling) */
		size_t		growth = 0;

		if (acc->hash != NULL && acc->hash->members + (uint64) n >= acc->hash->grow_threshold)
			growth += sizeof(Accum) * acc->hash->size * 2;
		if (acc->hash == NULL && acc->nmembers + (uint64) n > acc->capacity)
			growth += sizeof(Accum *) * (size_t) acc->capacity * 2;
		if (leaders->ntouched + n > leaders->capacity)
			growth += sizeof(int64) * (size_t) leaders->capacity * 2;
		if (growth > 0 && !budget_allows(budget, growth))
			return false;
	}
	for (j = 0; j < n; j++)
	{
		double		part = term->idf_weight * term_part(scoring, tf[j], len[j]);
		Accum	   *e;

		if (leaders != NULL)
		{
			e = accum_upsert(acc, seq[j]);
			if (e->round != leaders->round)
			{
				e->round = leaders->round;
				if (leaders->ntouched == leaders->capacity)
				{
					leaders->capacity *= 2;
					leaders->touched = repalloc_huge(leaders->touched,
													 sizeof(int64) * leaders->capacity);
				}
				leaders->touched[leaders->ntouched++] = e->seq;
			}
		}
		else
		{
			if (acc->live_bits != NULL && !live_bit(acc, seq[j]))
				continue;
			e = accum_find(acc, seq[j]);
			if (e == NULL || !e->live)
				continue;
		}
		e->score += part;
		e->seen |= bit;
	}
	last_stats.postings_read += n;
	return true;
}

static int	find_term(const Term *terms, int nterms, text *lexeme, int hint);

/* Blocks by key: term, tier, first seq, collection. */
static int
compare_block_key(const PostingsBlock *x, const PostingsBlock *y)
{
	if (x->term != y->term)
		return (x->term > y->term) - (x->term < y->term);
	if (x->tier != y->tier)
		return (x->tier > y->tier) - (x->tier < y->tier);
	if (x->first_seq != y->first_seq)
		return (x->first_seq > y->first_seq) - (x->first_seq < y->first_seq);
	return memcmp(&x->collection, &y->collection, sizeof(pg_uuid_t));
}

static int
compare_block_pointer_key(const void *a, const void *b)
{
	return compare_block_key(*(PostingsBlock *const *) a, *(PostingsBlock *const *) b);
}

/* The batch's block of a row's key (the batch sorted by key), or NULL when it is not one. */
static PostingsBlock *
batch_block(PostingsBlock **batch, int count, const BlockRow *row)
{
	PostingsBlock key;
	int			lo = 0;
	int			hi = count;

	key.term = row->term;
	memcpy(&key.collection, row->collection, sizeof(pg_uuid_t));
	key.tier = row->tier;
	key.first_seq = row->first_seq;
	while (lo < hi)
	{
		int			mid = lo + (hi - lo) / 2;
		int			c = compare_block_key(batch[mid], &key);

		if (c == 0)
			return batch[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/*
 * The rows of a blocks query (collection_id, lexeme, tier, first_seq, seqs, tfs, lengths),
 * handed one by one to `handle` where they are, in the scan's buffer: no copy of a block.
 */
typedef bool (*BlockRowHandler) (const BlockRow *row, void *arg);

/* The columns of the blocks queries, by their place. */
static const char *const BLOCK_COLUMN_NAMES[] = {
	"collection_id", "lexeme", "tier", "first_seq", "last_seq", "n", "seqs", "tfs", "lengths"
};

#define BLOCK_QUERY_COLUMNS 9

static void
null_bound(const char *column)
{
	ereport(ERROR,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("ragservice_bm25: a postings block with a null %s", column)));
}

/* A block's n and seq range as the blocks' bounds must hold them. */
static void
check_block_bounds(int64 first_seq, int64 last_seq, int32 n)
{
	if (n < 0 || n > MAX_BLOCK_POSTINGS)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("ragservice_bm25: a postings block of n = %d (at most %d postings)",
						n, MAX_BLOCK_POSTINGS)));
	if (first_seq > last_seq)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("ragservice_bm25: a postings block whose seq range [%lld, %lld] is "
						"empty", (long long) first_seq, (long long) last_seq)));
}

/* One of a block's arrays: one-dimensional, of `type`, no null element; its length. */
static int
block_array_length(ArrayType *array, Oid type, const char *column)
{
	if (ARR_ELEMTYPE(array) != type || ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("ragservice_bm25: a postings block whose %s is not a one-dimensional "
						"array of %s", column, format_type_be(type))));
	if (ARR_HASNULL(array))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("ragservice_bm25: a postings block with a null element in %s", column)));
	return ArrayGetNItems(ARR_NDIM(array), ARR_DIMS(array));
}

typedef struct BlockReceiver
{
	DestReceiver pub;
	const Term *terms;
	int			nterms;
	int			hint;
	BlockRowHandler handle;
	void	   *arg;
	MemoryContext row_context;	/* reset after each row (a detoasted array, if any) */
} BlockReceiver;

static bool
receive_block(TupleTableSlot *slot, DestReceiver *self)
{
	BlockReceiver *r = (BlockReceiver *) self;
	MemoryContext old;
	ArrayType  *seqs;
	ArrayType  *tfs;
	ArrayType  *lengths;
	BlockRow	row;
	int32		n;
	int			ntfs;
	int			nlengths;
	bool		more;
	int			i;

	CHECK_FOR_INTERRUPTS();
	slot_getsomeattrs(slot, BLOCK_QUERY_COLUMNS);
	for (i = 0; i < BLOCK_QUERY_COLUMNS; i++)
		if (slot->tts_isnull[i])
			null_bound(BLOCK_COLUMN_NAMES[i]);
	row.term = find_term(r->terms, r->nterms, DatumGetTextPP(slot->tts_values[1]), r->hint);
	if (row.term < 0)
		return true;
	r->hint = row.term;
	old = MemoryContextSwitchTo(r->row_context);
	row.collection = DatumGetUUIDP(slot->tts_values[0]);
	row.tier = DatumGetInt16(slot->tts_values[2]);
	row.first_seq = DatumGetInt64(slot->tts_values[3]);
	row.last_seq = DatumGetInt64(slot->tts_values[4]);
	n = DatumGetInt32(slot->tts_values[5]);
	check_block_bounds(row.first_seq, row.last_seq, n);
	seqs = DatumGetArrayTypeP(slot->tts_values[6]);
	tfs = DatumGetArrayTypeP(slot->tts_values[7]);
	lengths = DatumGetArrayTypeP(slot->tts_values[8]);
	row.n = block_array_length(seqs, INT8OID, "seqs");
	ntfs = block_array_length(tfs, INT2OID, "tfs");
	nlengths = block_array_length(lengths, INT4OID, "lengths");
	if (ntfs != row.n || nlengths != row.n)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("ragservice_bm25: a postings block whose seqs, tfs and lengths differ in "
						"length (%d, %d, %d)", row.n, ntfs, nlengths)));
	if (row.n != n)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("ragservice_bm25: a postings block of n = %d holding %d postings",
						n, row.n)));
	row.seqs = (const int64 *) ARR_DATA_PTR(seqs);
	row.tfs = (const int16 *) ARR_DATA_PTR(tfs);
	row.lengths = (const int32 *) ARR_DATA_PTR(lengths);
	for (i = 0; i < row.n; i++)
		if (row.seqs[i] < row.first_seq || row.seqs[i] > row.last_seq)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("ragservice_bm25: a posting (seq %lld) outside its block's seq range "
							"[%lld, %lld]", (long long) row.seqs[i], (long long) row.first_seq,
							(long long) row.last_seq)));
	more = r->handle(&row, r->arg);
	note_memory();
	MemoryContextSwitchTo(old);
	MemoryContextReset(r->row_context);
	/* false: the handler is done (out of its memory), the scan stops */
	return more;
}

static void
receiver_startup(DestReceiver *self, int operation, TupleDesc typeinfo)
{
}

static void
receiver_shutdown(DestReceiver *self)
{
}

/* Runs a prepared blocks query (parameters of the given types), its rows to `handle`. */
static void
run_blocks_query(SPIPlanPtr plan, int nargs, const Datum *values, const Oid *types,
				 const Term *terms, int nterms, BlockRowHandler handle, void *arg)
{
	ParamListInfo params = makeParamList(nargs);
	SPIExecuteOptions options;
	BlockReceiver receiver;
	MemoryContext caller = CurrentMemoryContext;
	int			rc;
	int			i;

	for (i = 0; i < nargs; i++)
	{
		params->params[i].value = values[i];
		params->params[i].isnull = false;
		params->params[i].pflags = PARAM_FLAG_CONST;
		params->params[i].ptype = types[i];
	}
	memset(&receiver, 0, sizeof(receiver));
	receiver.pub.receiveSlot = receive_block;
	receiver.pub.rStartup = receiver_startup;
	receiver.pub.rShutdown = receiver_shutdown;
	receiver.pub.rDestroy = receiver_shutdown;
	receiver.pub.mydest = DestNone;
	receiver.terms = terms;
	receiver.nterms = nterms;
	receiver.hint = -1;
	receiver.handle = handle;
	receiver.arg = arg;
	receiver.row_context = AllocSetContextCreate(CurrentMemoryContext, "ragservice_bm25 row",
												 ALLOCSET_SMALL_SIZES);
	memset(&options, 0, sizeof(options));
	options.params = params;
	options.read_only = true;
	options.dest = &receiver.pub;
	rc = SPI_execute_plan_extended(plan, &options);
	MemoryContextSwitchTo(caller);	/* SPI leaves its procedure's context current */
	/* a SELECT whose rows went to a receiver of its own is reported as a utility statement */
	if (rc != SPI_OK_SELECT && rc != SPI_OK_UTILITY)
		elog(ERROR, "ragservice_bm25: reading postings blocks failed: %s",
			 SPI_result_code_string(rc));
	MemoryContextDelete(receiver.row_context);
}

/* The distinct values of an array of datums, sorted by `compare` (in place; their count). */
static int
distinct_datums(Datum *values, int count, int (*compare) (const void *, const void *))
{
	int			kept = 0;
	int			i;

	qsort(values, count, sizeof(Datum), compare);
	for (i = 0; i < count; i++)
		if (kept == 0 || compare(&values[kept - 1], &values[i]) != 0)
			values[kept++] = values[i];
	return kept;
}

/* By the datum itself: a term's text datum is one pointer, shared by its blocks. */
static int
compare_pointer_datum(const void *a, const void *b)
{
	Datum		x = *(const Datum *) a;
	Datum		y = *(const Datum *) b;

	return (x > y) - (x < y);
}

static int
compare_int16_datum(const void *a, const void *b)
{
	int16		x = DatumGetInt16(*(const Datum *) a);
	int16		y = DatumGetInt16(*(const Datum *) b);

	return (x > y) - (x < y);
}

static int
compare_int64_datum(const void *a, const void *b)
{
	int64		x = DatumGetInt64(*(const Datum *) a);
	int64		y = DatumGetInt64(*(const Datum *) b);

	return (x > y) - (x < y);
}

static int
compare_uuid_datum(const void *a, const void *b)
{
	return memcmp(DatumGetUUIDP(*(const Datum *) a), DatumGetUUIDP(*(const Datum *) b),
				  sizeof(pg_uuid_t));
}

/* What read_blocks hands each row to. */
typedef struct BatchTarget
{
	PostingsBlock **batch;
	int			count;
	const Term *terms;
	const Scoring *scoring;
	Accumulator *acc;
	Leaders    *leaders;
	Budget	   *budget;
} BatchTarget;

static bool
add_batch_row(const BlockRow *row, void *arg)
{
	BatchTarget *target = (BatchTarget *) arg;

	/* a key of the scan's cross product that is not in the batch is left alone */
	if (batch_block(target->batch, target->count, row) == NULL)
		return true;
	return add_block_postings(row, target->terms, target->scoring, target->acc, target->leaders,
							  target->budget);
}

/*
 * Reads the given blocks and adds their postings to the chunks' scores: to every chunk (new
 * ones entered, each noted in `leaders`) in phase 2, else (NULL) only to the live chunks
 * already there. Sorts the batch by key. False when the pruning's budget ran out on the way
 * (the scores are then incomplete: the caller gives up the pruning).
 */
static bool
read_blocks(const BlockReader *reader, PostingsBlock **batch, int count, const Term *terms,
			int nterms, const Scoring *scoring, Accumulator *acc, Leaders *leaders,
			Budget *budget)
{
	Datum	   *collections = palloc(sizeof(Datum) * count);
	Datum	   *lexemes = palloc(sizeof(Datum) * count);
	Datum	   *tiers = palloc(sizeof(Datum) * count);
	Datum	   *firsts = palloc(sizeof(Datum) * count);
	int			ncollections = count;
	int			nlexemes = count;
	int			ntiers = count;
	int			nfirsts = count;
	bool		by_scan = count > LOOKUP_BLOCKS_MAX;
	Datum		args[4];
	Oid			types[4] = {UUIDARRAYOID, TEXTARRAYOID, INT2ARRAYOID, INT8ARRAYOID};
	BatchTarget target = {batch, count, terms, scoring, acc, leaders, budget};
	int			i;

	qsort(batch, count, sizeof(PostingsBlock *), compare_block_pointer_key);
	for (i = 0; i < count; i++)
	{
		collections[i] = UUIDPGetDatum(&batch[i]->collection);
		lexemes[i] = terms[batch[i]->term].text;
		tiers[i] = Int16GetDatum(batch[i]->tier);
		firsts[i] = Int64GetDatum(batch[i]->first_seq);
		batch[i]->read = true;
	}
	if (by_scan)
	{
		/* each column's distinct values: the scan reads their cross product */
		ncollections = distinct_datums(collections, count, compare_uuid_datum);
		nlexemes = distinct_datums(lexemes, count, compare_pointer_datum);
		ntiers = distinct_datums(tiers, count, compare_int16_datum);
		nfirsts = distinct_datums(firsts, count, compare_int64_datum);
	}
	args[0] = PointerGetDatum(construct_array(collections, ncollections, UUIDOID, UUID_LEN,
											  false, TYPALIGN_CHAR));
	args[1] = PointerGetDatum(construct_array_builtin(lexemes, nlexemes, TEXTOID));
	args[2] = PointerGetDatum(construct_array_builtin(tiers, ntiers, INT2OID));
	args[3] = PointerGetDatum(construct_array_builtin(firsts, nfirsts, INT8OID));
	run_blocks_query(by_scan ? reader->by_scan : reader->by_lookup, 4, args, types, terms, nterms,
					 add_batch_row, &target);
	last_stats.blocks_read += count;
	return !budget->exceeded;
}

/* The query's terms, each once (a repeated term's weights add up, as the SQL path's join does). */
static int
collect_terms(ArrayType *terms_array, ArrayType *weights_array, Term **out)
{
	Datum	   *texts;
	bool	   *text_nulls;
	int			ntexts;
	Datum	   *weights = NULL;
	bool	   *weight_nulls = NULL;
	int			nweights = 0;
	Term	   *terms;
	int			nterms = 0;
	int			i;

	deconstruct_array_builtin(terms_array, TEXTOID, &texts, &text_nulls, &ntexts);
	if (weights_array != NULL)
	{
		deconstruct_array_builtin(weights_array, FLOAT8OID, &weights, &weight_nulls, &nweights);
		if (nweights != ntexts)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("terms and weights must have the same length")));
	}
	terms = palloc0(sizeof(Term) * Max(ntexts, 1));
	for (i = 0; i < ntexts; i++)
	{
		text	   *t;
		const char *lexeme;
		int			length;
		double		weight = 1.0;
		int			j;

		if (text_nulls[i] || (weights != NULL && weight_nulls[i]))
			continue;
		if (weights != NULL)
			weight = DatumGetFloat8(weights[i]);
		t = DatumGetTextPP(texts[i]);
		lexeme = VARDATA_ANY(t);
		length = VARSIZE_ANY_EXHDR(t);
		for (j = 0; j < nterms; j++)
			if (terms[j].length == length && memcmp(terms[j].lexeme, lexeme, length) == 0)
				break;
		if (j < nterms)
		{
			terms[j].weight += weight;
			continue;
		}
		terms[nterms].lexeme = lexeme;
		terms[nterms].length = length;
		terms[nterms].text = PointerGetDatum(cstring_to_text_with_len(lexeme, length));
		terms[nterms].weight = weight;
		nterms++;
	}
	*out = terms;
	return nterms;
}

static int
find_term(const Term *terms, int nterms, text *lexeme, int hint)
{
	const char *data = VARDATA_ANY(lexeme);
	int			length = VARSIZE_ANY_EXHDR(lexeme);
	int			t;

	if (hint >= 0 && terms[hint].length == length && memcmp(terms[hint].lexeme, data, length) == 0)
		return hint;
	for (t = 0; t < nterms; t++)
		if (terms[t].length == length && memcmp(terms[t].lexeme, data, length) == 0)
			return t;
	return -1;
}

/* N and the average length over the collections (their totals rows summed). */
static void
read_totals(Datum collections, double *n, double *avgdl)
{
	Oid			types[1] = {UUIDARRAYOID};
	Datum		args[1] = {collections};
	bool		isnull;
	double		chunks;
	double		tokens;
	MemoryContext caller = CurrentMemoryContext;
	int			rc;

	rc = SPI_execute_with_args(
		psprintf("SELECT coalesce(sum(chunk_count), 0)::float8, "
				 "coalesce(sum(token_count), 0)::float8 FROM %s WHERE collection_id = ANY($1)",
				 stats_table),
		1, types, args, NULL, true, 1);
	MemoryContextSwitchTo(caller);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "ragservice_bm25: reading the collections' totals failed");
	chunks = DatumGetFloat8(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	tokens = DatumGetFloat8(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	note_memory();
	SPI_freetuptable(SPI_tuptable);
	*n = chunks;
	*avgdl = tokens / Max(chunks, 1.0);
}

/* Each term's weight times idf, from N and its df. */
static void
set_idf(Term *terms, int nterms, double n)
{
	int			i;

	for (i = 0; i < nterms; i++)
		terms[i].idf_weight = terms[i].weight
			* log(1 + (n - terms[i].df + 0.5) / (terms[i].df + 0.5));
}

/* A column of a bounds row, refused when null. */
static Datum
bound_column(HeapTuple tuple, TupleDesc desc, int column, const char *name)
{
	bool		isnull;
	Datum		value = SPI_getbinval(tuple, desc, column, &isnull);

	if (isnull)
		null_bound(name);
	return value;
}

/*
 * Every block of the terms in the collections, with its bound; the terms' df and idf. -1 (and
 * nothing read) when the terms have more than `max_blocks` blocks: their list would not fit in
 * the call's memory.
 */
static int
read_block_bounds(Datum collections, Datum terms_datum, Term *terms, int nterms,
				  const Scoring *scoring, double n, int64 max_blocks, PostingsBlock **out)
{
	Oid			types[2] = {UUIDARRAYOID, TEXTARRAYOID};
	Datum		args[2] = {collections, terms_datum};
	PostingsBlock	   *blocks;
	int			nblocks = 0;
	int			hint = -1;
	uint64		row;
	MemoryContext caller = CurrentMemoryContext;
	int			rc;
	int			i;

	rc = SPI_execute_with_args(
		on_postings("SELECT p.collection_id, p.lexeme, p.tier, p.first_seq, p.last_seq, p.n, "
					"p.max_tf, p.min_len FROM %s p "
					"WHERE p.collection_id = ANY($1) AND p.lexeme = ANY($2)"),
		2, types, args, NULL, true, Min(max_blocks, INT_MAX - 1) + 1);
	MemoryContextSwitchTo(caller);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "ragservice_bm25: reading postings bounds failed");
	if ((int64) SPI_processed > max_blocks)
	{
		note_memory();
		SPI_freetuptable(SPI_tuptable);
		*out = NULL;
		return -1;
	}
	blocks = palloc(sizeof(PostingsBlock) * Max(SPI_processed, 1));
	for (row = 0; row < SPI_processed; row++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[row];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		PostingsBlock	   *block = &blocks[nblocks];
		int			t;

		CHECK_FOR_INTERRUPTS();
		t = find_term(terms, nterms,
					  DatumGetTextPP(bound_column(tuple, desc, 2, "lexeme")), hint);
		if (t < 0)
			continue;
		hint = t;
		memcpy(&block->collection,
			   DatumGetUUIDP(bound_column(tuple, desc, 1, "collection_id")), sizeof(pg_uuid_t));
		block->term = t;
		block->tier = DatumGetInt16(bound_column(tuple, desc, 3, "tier"));
		block->first_seq = DatumGetInt64(bound_column(tuple, desc, 4, "first_seq"));
		block->last_seq = DatumGetInt64(bound_column(tuple, desc, 5, "last_seq"));
		block->n = DatumGetInt32(bound_column(tuple, desc, 6, "n"));
		block->max_tf = DatumGetInt16(bound_column(tuple, desc, 7, "max_tf"));
		block->min_len = DatumGetInt32(bound_column(tuple, desc, 8, "min_len"));
		check_block_bounds(block->first_seq, block->last_seq, block->n);
		block->read = false;
		terms[t].df += block->n;
		nblocks++;
	}
	note_memory();
	SPI_freetuptable(SPI_tuptable);

	set_idf(terms, nterms, n);
	for (i = 0; i < nblocks; i++)
		blocks[i].bound = terms[blocks[i].term].idf_weight
			* term_part(scoring, blocks[i].max_tf, blocks[i].min_len);
	*out = blocks;
	return nblocks;
}

/*
 * The terms' df and idf, their blocks' count, postings and seq range, summed by the server:
 * for terms with too many blocks to list. A block with a null or impossible bound is refused
 * here (the window scan reads the blocks by their seq range).
 */
static void
read_term_totals(Datum collections, Datum terms_datum, Term *terms, int nterms, double n,
				 int64 *nblocks, int64 *postings, int64 *first_seq, int64 *last_seq)
{
	Oid			types[2] = {UUIDARRAYOID, TEXTARRAYOID};
	Datum		args[2] = {collections, terms_datum};
	uint64		row;
	MemoryContext caller = CurrentMemoryContext;
	int			rc;

	rc = SPI_execute_with_args(on_postings(TERM_TOTALS), 2, types, args, NULL, true, 0);
	MemoryContextSwitchTo(caller);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "ragservice_bm25: reading the terms' totals failed");
	*nblocks = 0;
	*postings = 0;
	for (row = 0; row < SPI_processed; row++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[row];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		text	   *lexeme = DatumGetTextPP(bound_column(tuple, desc, 1, "lexeme"));
		int			t = find_term(terms, nterms, lexeme, -1);
		int64		bad = DatumGetInt64(bound_column(tuple, desc, 6, "count"));

		if (bad > 0)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("ragservice_bm25: %lld postings blocks of \"%s\" with a null or "
							"impossible bound (n, seq range, max_tf or min_len)",
							(long long) bad, text_to_cstring(lexeme))));
		if (t < 0)
			continue;
		terms[t].df = DatumGetFloat8(bound_column(tuple, desc, 2, "n"));
		*first_seq = Min(*first_seq, DatumGetInt64(bound_column(tuple, desc, 3, "first_seq")));
		*last_seq = Max(*last_seq, DatumGetInt64(bound_column(tuple, desc, 4, "last_seq")));
		*nblocks += DatumGetInt64(bound_column(tuple, desc, 5, "count"));
		*postings += (int64) terms[t].df;
	}
	note_memory();
	SPI_freetuptable(SPI_tuptable);
	set_idf(terms, nterms, n);
}

static bool
bounds_hold(const Term *terms, int nterms, const Scoring *scoring)
{
	int			i;

	if (!(scoring->k1 >= 0 && scoring->b >= 0 && scoring->b <= 1 && scoring->avgdl > 0))
		return false;
	for (i = 0; i < nterms; i++)
		if (!(terms[i].idf_weight >= 0))
			return false;
	return true;
}

/* Whether the sorted seqs hold one in [first, last]. */
static bool
holds_seq_in(const int64 *seqs, int count, int64 first, int64 last)
{
	int			lo = 0;
	int			hi = count;

	while (lo < hi)
	{
		int			mid = lo + (hi - lo) / 2;

		if (seqs[mid] < first)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < count && seqs[lo] <= last;
}

/* A chunk's partial score plus the highest unread bound of each term not yet seen in it. */
static double
unseen_bound(const Accum *e, const Term *terms, int nterms)
{
	double		bound = e->score;
	int			t;

	for (t = 0; t < nterms; t++)
		if ((e->seen & SEEN_BIT(t)) == 0)
			bound += terms[t].unread_bound;
	return bound;
}

/*
 * Phase 3: completes the scores of the seen chunks that can still reach theta (live: partial
 * score plus the highest unread bound of each term not yet seen in the chunk). In rounds, from
 * the highest bound down, it reads the unread blocks of a term t whose seq range holds a live
 * chunk not yet seen in t; a block that holds none is settled unread (no live chunk has a
 * posting there, and live chunks only ever get fewer), which lowers its term's unread bound.
 * Each round raises theta and lowers the bounds, so fewer chunks stay live.
 *
 * False when it gives up: the exhaustive scan is cheaper (may_give_up), or its lists of the
 * live chunks would take the pruning over its budget.
 */
static bool
complete_live_chunks(const BlockReader *reader, Accumulator *acc, Term *terms, int nterms,
					 PostingsBlock *blocks, int nblocks, int64 postings, int k,
					 const Scoring *scoring, PostingsBlock **batch, bool may_give_up,
					 Budget *budget)
{
	Accum	  **live;
	int64	  **wanted;
	int		   *nwanted;
	int			nlive = 0;
	int			round_size = FIRST_ROUND;
	double		theta;
	AccumIterator it;
	Accum	   *e;
	int			t;
	int			i;

	/*
	 * The chunks live by phase 2's bounds, in seq order (the wanted lists come out sorted): with
	 * the array, read off the bitmap of live chunks, else sorted. Most postings read from here on
	 * belong to no live chunk: the bitmap says so from cache.
	 */
	/* the live list, each term's wanted list (at most one entry a live chunk), the bitmap */
	if (!budget_allows(budget, (sizeof(Accum *) + sizeof(int64) * nterms)
					   * (size_t) Max(accum_count(acc), 1)
					   + (acc->range <= LIVE_BITS_MAX_RANGE ? (size_t) acc->range / 8 + 8 : 0)))
		return false;
	live = palloc_extended(sizeof(Accum *) * Max(accum_count(acc), 1), MCXT_ALLOC_HUGE);
	wanted = palloc(sizeof(int64 *) * nterms);
	nwanted = palloc0(sizeof(int) * nterms);
	theta = kth_largest(acc, k, false);
	unread_bounds(terms, nterms, blocks, nblocks);
	if (acc->range <= LIVE_BITS_MAX_RANGE)
		acc->live_bits = palloc0(sizeof(uint64) * ((acc->range + 63) / 64));
	accum_start(acc, &it);
	while ((e = accum_next(acc, &it)) != NULL)
	{
		e->live = unseen_bound(e, terms, nterms) >= theta - SLACK * fabs(theta);
		if (!e->live)
			continue;
		if (acc->live_bits != NULL)
			set_live_bit(acc, e->seq, true);
		live[nlive++] = e;
	}
	if (acc->slots != NULL && acc->live_bits != NULL)
	{
		BitWalk		walk = bit_walk(acc->live_bits, acc->range);
		int64		off;

		nlive = 0;
		while (bit_walk_next(&walk, &off))
			live[nlive++] = &acc->slots[off];
	}
	else
		sort_live(live, nlive);
	for (t = 0; t < nterms; t++)
		wanted[t] = palloc_extended(sizeof(int64) * Max(nlive, 1), MCXT_ALLOC_HUGE);

	for (;;)
	{
		double		slack;
		int			kept = 0;
		int			count = 0;
		int64		wanted_postings = 0;
		bool		all;

		theta = kth_largest_of(live, nlive, k);
		slack = SLACK * fabs(theta);
		unread_bounds(terms, nterms, blocks, nblocks);
		for (t = 0; t < nterms; t++)
			nwanted[t] = 0;
		for (i = 0; i < nlive; i++)
		{
			e = live[i];
			e->live = unseen_bound(e, terms, nterms) >= theta - slack;
			if (!e->live)
			{
				if (acc->live_bits != NULL)
					set_live_bit(acc, e->seq, false);
				continue;
			}
			live[kept++] = e;
			for (t = 0; t < nterms; t++)
				if ((e->seen & SEEN_BIT(t)) == 0)
					wanted[t][nwanted[t]++] = e->seq;
		}
		nlive = kept;
		CHECK_FOR_INTERRUPTS();
		for (i = 0; i < nblocks; i++)
		{
			if (blocks[i].read)
				continue;
			t = blocks[i].term;
			if (!holds_seq_in(wanted[t], nwanted[t], blocks[i].first_seq, blocks[i].last_seq))
				blocks[i].read = true;	/* settled: no live chunk's posting is there */
			else
			{
				batch[count++] = &blocks[i];
				wanted_postings += blocks[i].n;
			}
		}
		if (count == 0)
			break;
		/*
		 * A round reads the wanted blocks with the highest bounds; when they hold a quarter of
		 * the query's postings or more, all of them at once (the rounds would not pay for
		 * their bookkeeping), which completes every live chunk.
		 */
		all = wanted_postings * 4 >= postings;
		if (all && may_give_up)
			return false;		/* cheaper exhaustive: see score_in_windows */
		if (!read_blocks(reader, batch, all ? count : Min(count, round_size), terms, nterms,
						 scoring, acc, NULL, budget))
			return false;
		last_stats.rounds++;
		round_size *= 2;
		if (all)
			break;
	}
	return true;
}

/* Whether the exhaustive path's dense array suits the seq range. */
static bool
exhaustive_fits(int64 first_seq, int64 last_seq, int64 postings)
{
	uint64		span = seq_span(first_seq, last_seq);

	return postings > 0 && first_seq <= last_seq && span < (uint64) EXHAUSTIVE_MAX_RANGE
		&& span < (uint64) (EXHAUSTIVE_SLOTS_PER_POSTING * postings);
}

/* A window's partial score in a hash (ranges too sparse for an array). */
typedef struct WindowScore
{
	int64		seq;
	double		score;
	char		status;
} WindowScore;

#define SH_PREFIX wsc
#define SH_ELEMENT_TYPE WindowScore
#define SH_GROW_MIN_FILLFACTOR TABLE_GROWS_ONLY_WHEN_FULL
#define SH_FILLFACTOR TABLE_FILL
#define SH_KEY_TYPE int64
#define SH_KEY seq
#define SH_HASH_KEY(tb, key) seq_hash(key)
#define SH_EQUAL(tb, a, b) ((a) == (b))
#define SH_SCOPE static inline
#define SH_DECLARE
#define SH_DEFINE
#include "lib/simplehash.h"

/*
 * The exhaustive scan's results: the k best scores so far and those tying with the k-th;
 * `floor` (the k-th best once k are in) only rises.
 */
typedef struct Candidates
{
	ScoredSeq  *items;
	int			count;
	int			capacity;
	int			k;
	double		floor;
	Budget	   *budget;
} Candidates;

static int
compare_scored_desc(const void *a, const void *b)
{
	double		x = ((const ScoredSeq *) a)->score;
	double		y = ((const ScoredSeq *) b)->score;

	return (x < y) - (x > y);
}

static void
work_mem_too_small(const char *what, long long count)
{
	ereport(ERROR,
			(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
			 errmsg("ragservice_bm25: %s (%lld) needs more memory than work_mem (%d kB) allows",
					what, count, work_mem),
			 errhint("Raise work_mem for the statement, or ask for fewer chunks.")));
}

/* Keeps the k best and their ties, raising the floor to the k-th best. */
static void
candidates_compact(Candidates *c)
{
	int			kept;

	if (c->count < c->k)
		return;
	qsort(c->items, c->count, sizeof(ScoredSeq), compare_scored_desc);
	c->floor = c->items[c->k - 1].score;
	for (kept = c->k; kept < c->count && c->items[kept].score >= c->floor; kept++)
		;
	c->count = kept;
}

static inline void
candidates_offer(Candidates *c, double score, int64 seq)
{
	if (!(score >= c->floor))
		return;
	if (c->count == c->capacity)
	{
		candidates_compact(c);
		if (c->count == c->capacity)
		{
			/* ties at the k-th score fill it: room for more of them, within the budget */
			size_t		bytes = sizeof(ScoredSeq) * (size_t) c->capacity;

			if (c->capacity > INT_MAX / 2 || !budget_allows(c->budget, bytes))
				work_mem_too_small("the chunks tying at the k-th score", c->count);
			c->items = repalloc_huge(c->items, bytes * 2);
			c->capacity *= 2;
		}
		if (!(score >= c->floor))
			return;
	}
	c->items[c->count++] = (ScoredSeq) {score, seq};
}

/* One window's scores: an array over [lo, hi] (and a bit a seen seq), or a bounded hash. */
typedef struct Window
{
	const Term *terms;
	const Scoring *scoring;
	int64		lo;
	int64		hi;
	double	   *scores;
	uint64	   *seen;
	wsc_hash   *hash;
	bool		overflow;		/* the hash is full: the window is to be halved */
} Window;

/* Adds a row of BLOCKS_IN_WINDOW's postings in the window to its scores. */
static bool
add_window_row(const BlockRow *row, void *arg)
{
	Window	   *w = (Window *) arg;
	double		idf_weight = w->terms[row->term].idf_weight;
	uint64		width = seq_span(w->lo, w->hi);
	int			j;

	for (j = 0; j < row->n; j++)
	{
		int64		seq = row->seqs[j];
		double		part;

		if (seq < w->lo || seq > w->hi)
			continue;			/* another window's */
		part = idf_weight * term_part(w->scoring, row->tfs[j], row->lengths[j]);
		if (w->scores != NULL)
		{
			uint64		off = (uint64) seq - (uint64) w->lo;

			if (off > width)
				posting_out_of_range(seq, w->lo, w->hi);
			w->scores[off] += part;
			w->seen[off >> 6] |= UINT64CONST(1) << (off & 63);
		}
		else
		{
			WindowScore *e = wsc_lookup(w->hash, seq);
			bool		found;

			if (e == NULL)
			{
				if (w->hash->members + 1 >= w->hash->grow_threshold)
				{
					w->overflow = true;
					return false;
				}
				e = wsc_insert(w->hash, seq, &found);
				e->score = 0;
			}
			e->score += part;
		}
	}
	last_stats.postings_read += row->n;
	last_stats.blocks_read++;
	return true;
}

/*
 * Exhaustive BM25 within the call's budget: every block of the terms read by windows of the
 * seq range, each posting added to the window's scores, the window's chunks offered to the
 * results (the k best and their ties). A window is an array (8 bytes and a bit a seq) when
 * that fits and the range is dense enough, else a hash of what fits; a window whose chunks
 * overflow the hash is halved and read again. With room for an array over the whole range,
 * one window and one scan of the primary key (a third of the cost a block of reading them by
 * key, and none of the pruning's bookkeeping).
 */
static void
score_in_windows(SPIPlanPtr plan, Datum collections, Datum terms_datum, const Term *terms,
				 int nterms, const Scoring *scoring, int64 first_seq, int64 last_seq,
				 int64 postings, int k, Budget *budget, ReturnSetInfo *rsinfo)
{
	Window		w = {terms, scoring};
	Oid			types[4] = {UUIDARRAYOID, TEXTARRAYOID, INT8OID, INT8OID};
	Datum		args[4] = {collections, terms_datum};
	Candidates	c = {NULL, 0, 0, k, -INFINITY, budget};
	int64		los[160];
	int64		his[160];
	int			depth = 0;
	size_t		used;
	size_t		avail;
	uint64		dense_max;
	uint64		hash_size = 256;
	int			i;

	if (postings <= 0 || first_seq > last_seq)
		return;
	c.capacity = Max(2 * k, 64);
	if (!budget_allows(budget, sizeof(ScoredSeq) * (size_t) c.capacity))
		work_mem_too_small("k", k);
	c.items = palloc_extended(sizeof(ScoredSeq) * (size_t) c.capacity, MCXT_ALLOC_HUGE);

	/* what is left for a window: an array of 8 bytes and a bit a seq, or a hash */
	used = budget_used(budget);
	avail = budget->limit > used ? budget->limit - used : 0;
	dense_max = (uint64) avail * 8 / 65;
	while (hash_size * 2 * sizeof(WindowScore) <= avail && hash_size < (UINT64CONST(1) << 30))
		hash_size *= 2;

	los[0] = first_seq;
	his[0] = last_seq;
	depth = 1;
	while (depth > 0)
	{
		MemoryContext window_context;
		MemoryContext old;
		uint64		span;

		CHECK_FOR_INTERRUPTS();
		depth--;
		w.lo = los[depth];
		w.hi = his[depth];
		span = seq_span(w.lo, w.hi);
		window_context = AllocSetContextCreate(budget->context, "ragservice_bm25 window",
											   ALLOCSET_DEFAULT_SIZES);
		old = MemoryContextSwitchTo(window_context);
		w.scores = NULL;
		w.seen = NULL;
		w.hash = NULL;
		w.overflow = false;
		if (span < dense_max && span < (uint64) (EXHAUSTIVE_SLOTS_PER_POSTING * postings))
		{
			w.scores = allocate_zeroed(sizeof(double) * (size_t) (span + 1));
			w.seen = allocate_zeroed(sizeof(uint64) * (size_t) (span / 64 + 1));
			if (w.scores == NULL || w.seen == NULL)
				work_mem_too_small("the seq range", (long long) span);
		}
		else
			/* SH_CREATE rounds the size to the power of two above nelements / TABLE_FILL */
			w.hash = wsc_create(window_context,
								(uint32) Min((double) hash_size * (TABLE_FILL - 0.01),
											 (double) postings + 16),
								NULL);
		args[2] = Int64GetDatum(w.lo);
		args[3] = Int64GetDatum(w.hi);
		run_blocks_query(plan, 4, args, types, terms, nterms, add_window_row, &w);
		last_stats.rounds++;
		MemoryContextSwitchTo(old);
		if (w.overflow)
		{
			/* halved: the lower half read first (the stack's top), then the upper */
			int64		mid = (int64) ((uint64) w.lo + span / 2);

			if (depth + 2 > lengthof(los))
				elog(ERROR, "ragservice_bm25: too many windows");
			los[depth] = mid + 1;
			his[depth] = w.hi;
			los[depth + 1] = w.lo;
			his[depth + 1] = mid;
			depth += 2;
		}
		else if (w.scores != NULL)
		{
			BitWalk		walk = bit_walk(w.seen, (int64) span + 1);
			int64		off;

			while (bit_walk_next(&walk, &off))
				candidates_offer(&c, w.scores[off], w.lo + off);
		}
		else
		{
			wsc_iterator it;
			WindowScore *e;

			wsc_start_iterate(w.hash, &it);
			while ((e = wsc_iterate(w.hash, &it)) != NULL)
				candidates_offer(&c, e->score, e->seq);
		}
		note_memory();
		MemoryContextDelete(window_context);
	}

	candidates_compact(&c);
	for (i = 0; i < c.count; i++)
	{
		Datum		values[2] = {Int64GetDatum(c.items[i].seq), Float8GetDatum(c.items[i].score)};
		bool		nulls[2] = {false, false};

		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
}

/*
 * A statement planned once for any parameters: a custom plan would plan again for every call,
 * with arrays of thousands of keys.
 */
static SPIPlanPtr
prepare_generic(const char *query, int nargs, Oid *types)
{
	MemoryContext caller = CurrentMemoryContext;
	SPIPlanPtr	plan = SPI_prepare_cursor(query, nargs, types, CURSOR_OPT_GENERIC_PLAN);

	MemoryContextSwitchTo(caller);
	if (plan == NULL)
		elog(ERROR, "ragservice_bm25: preparing a blocks query failed: %s",
			 SPI_result_code_string(SPI_result));
	return plan;
}

/*
 * The top k over the tables named by postings_table and stats_table, from the arguments
 * (collections, terms, weights, k, k1, b) starting at `first`.
 */
static Datum
topk(FunctionCallInfo fcinfo, int first)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum		collections;
	Datum		terms_datum;
	Term	   *terms;
	int			nterms;
	int			k;
	Scoring		scoring;
	double		n;
	PostingsBlock	   *blocks = NULL;
	PostingsBlock	  **batch;
	int			nblocks;
	int			round_size = FIRST_ROUND;
	int64		postings = 0;
	int64		max_blocks;
	Leaders		leaders;
	bool		prune = false;
	bool		live_only = false;
	double		cut;
	BlockReader reader;
	Accumulator *acc;
	bool		dense;
	bool		may_give_up;
	bool		exhaustive = false;
	Budget		budget;
	MemoryContext call;
	MemoryContext pruning;
	AccumIterator it;
	Accum	   *e;
	int64		first_seq = PG_INT64_MAX;
	int64		last_seq = PG_INT64_MIN;
	int			i;
	Oid			block_types[4] = {UUIDARRAYOID, TEXTARRAYOID, INT2ARRAYOID, INT8ARRAYOID};
	Oid			window_types[4] = {UUIDARRAYOID, TEXTARRAYOID, INT8OID, INT8OID};

	InitMaterializedSRF(fcinfo, 0);
	memset(&last_stats, 0, sizeof(last_stats));
	memory_peak.tracked = message_level_is_interesting(DEBUG1);
	if (memory_peak.tracked)
		memory_peak.start = memory_peak.peak = MemoryContextMemAllocated(TopMemoryContext, true);
	if (PG_ARGISNULL(first) || PG_ARGISNULL(first + 1) || PG_ARGISNULL(first + 3)
		|| PG_ARGISNULL(first + 4) || PG_ARGISNULL(first + 5))
		return (Datum) 0;
	collections = PG_GETARG_DATUM(first);
	terms_datum = PG_GETARG_DATUM(first + 1);
	k = PG_GETARG_INT32(first + 3);
	scoring.k1 = PG_GETARG_FLOAT8(first + 4);
	scoring.b = PG_GETARG_FLOAT8(first + 5);
	if (k <= 0)
		return (Datum) 0;
	if (k > MAX_K)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("k must be at most %d", MAX_K)));
	nterms = collect_terms(PG_GETARG_ARRAYTYPE_P(first + 1),
						   PG_ARGISNULL(first + 2) ? NULL : PG_GETARG_ARRAYTYPE_P(first + 2),
						   &terms);
	if (nterms == 0)
		return (Datum) 0;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "ragservice_bm25: SPI_connect failed");

	/*
	 * The call's memory, in a context of its own below SPI's procedure context (gone with
	 * SPI_finish, or with the transaction on an error), sized against work_mem: a quarter for
	 * the blocks' list, the rest for the pruning's partial scores or the exhaustive scan's
	 * windows. (SPI keeps its plans and the rows of the bounds query, at most as many as the
	 * blocks' list takes, in its own.)
	 */
	call = AllocSetContextCreate(CurrentMemoryContext, "ragservice_bm25", ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(call);
	budget.context = call;
	budget.limit = call_budget();
	budget.exceeded = false;
	read_totals(collections, &n, &scoring.avgdl);
	set_length_norm(&scoring);
	max_blocks = (int64) (budget.limit / 4 / BOUNDS_ROW_BYTES);
	nblocks = read_block_bounds(collections, terms_datum, terms, nterms, &scoring, n, max_blocks,
								&blocks);
	if (nblocks < 0)
	{
		/* too many blocks to list: the windows, from the terms' totals */
		read_term_totals(collections, terms_datum, terms, nterms, n, &last_stats.blocks,
						 &postings, &first_seq, &last_seq);
		nblocks = 0;
		exhaustive = true;
	}
	else
	{
		last_stats.blocks = nblocks;
		for (i = 0; i < nblocks; i++)
		{
			postings += blocks[i].n;
			first_seq = Min(first_seq, blocks[i].first_seq);
			last_seq = Max(last_seq, blocks[i].last_seq);
		}
		prune = bounds_hold(terms, nterms, &scoring);
		if (prune)
			qsort(blocks, nblocks, sizeof(PostingsBlock), compare_bound_desc);
	}

	dense = accumulator_choice != ACCUMULATOR_HASH
		&& (accumulator_choice == ACCUMULATOR_ARRAY
			? postings > 0 && first_seq <= last_seq
			&& seq_span(first_seq, last_seq) < (uint64) EXHAUSTIVE_MAX_RANGE
			: exhaustive_fits(first_seq, last_seq, postings));
	exhaustive = exhaustive || (!prune && dense);
	may_give_up = dense && postings >= exhaustive_min_postings;

	/* the pruning's memory, given back at once if it gives up (the exhaustive path reuses it) */
	if (!exhaustive)
	{
		reader.by_lookup = prepare_generic(on_postings(BLOCKS_BY_LOOKUP), 4, block_types);
		reader.by_scan = prepare_generic(on_postings(BLOCKS_BY_SCAN), 4, block_types);
	}
	pruning = AllocSetContextCreate(call, "ragservice_bm25 pruning", ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(pruning);
	if (!exhaustive
		&& !budget_allows(&budget, sizeof(PostingsBlock *) * (size_t) Max(nblocks, 1)
						  + (sizeof(int64) + 2 * sizeof(ScoredSeq)) * (size_t) k + 8192))
		exhaustive = true;
	if (!exhaustive)
	{
		size_t		used = budget_used(&budget);

		acc = accum_create(first_seq, last_seq, postings,
						   budget.limit > used ? budget.limit - used : 0);
		batch = palloc(sizeof(PostingsBlock *) * Max(nblocks, 1));
		leaders.capacity = 1024;
		leaders.touched = palloc(sizeof(int64) * leaders.capacity);
		leaders.ntouched = 0;
		leaders.top = palloc(sizeof(int64) * k);
		leaders.ntop = 0;
		leaders.round = 1;
		for (i = 0; i < nterms; i++)
			terms[i].essential = true;
	}

	/*
	 * Phase 2: the blocks with the highest bounds first, in rounds, from the essential terms only
	 * (MaxScore: a chunk found only in the non-essential terms, whose highest unread bounds add
	 * up to less than theta, cannot enter the top k), until no essential term is left.
	 */
	while (!exhaustive)
	{
		int			count = 0;
		double		theta;

		CHECK_FOR_INTERRUPTS();
		for (i = 0; i < nblocks && (!prune || count < round_size); i++)
			if (!blocks[i].read && terms[blocks[i].term].essential)
				batch[count++] = &blocks[i];
		if (count == 0)
			break;
		if (!read_blocks(&reader, batch, count, terms, nterms, &scoring, acc, &leaders, &budget))
		{
			exhaustive = true;	/* over the budget: the windows */
			break;
		}
		last_stats.rounds++;
		round_size *= 2;
		if (!prune)
			break;
		if (may_give_up && last_stats.postings_read * 128 >= postings)
		{
			/*
			 * A 128th of the postings read and still going: the bounds are not paying for
			 * their bookkeeping on this query. The exhaustive scan costs a seventh a posting
			 * of reading by key into the partial scores.
			 */
			exhaustive = true;
			break;
		}
		if (last_stats.postings_read * 2 >= postings)
		{
			/* Half the postings read, the exhaustive scan not open to it: read the rest. */
			count = 0;
			for (i = 0; i < nblocks; i++)
				if (!blocks[i].read)
					batch[count++] = &blocks[i];
			if (count > 0
				&& !read_blocks(&reader, batch, count, terms, nterms, &scoring, acc, &leaders,
								&budget))
				exhaustive = true;
			last_stats.rounds++;
			break;
		}
		theta = round_theta(acc, &leaders, k);
		unread_bounds(terms, nterms, blocks, nblocks);
		if (theta > 0 && mark_essential_terms(terms, nterms, theta) == 0)
			break;
	}

	/* Phase 3: complete the chunks that still could reach theta, if any block is left unread. */
	if (!exhaustive && prune && last_stats.blocks_read < nblocks)
	{
		exhaustive = !complete_live_chunks(&reader, acc, terms, nterms, blocks, nblocks, postings,
										   k, &scoring, batch, may_give_up, &budget);
		live_only = true;
	}

	if (exhaustive)
	{
		note_memory();
		MemoryContextSwitchTo(call);
		MemoryContextDelete(pruning);
		score_in_windows(prepare_generic(on_postings(BLOCKS_IN_WINDOW), 4, window_types), collections,
						 terms_datum, terms, nterms, &scoring, first_seq, last_seq, postings, k,
						 &budget, rsinfo);
	}
	else
	{
		/* Phase 4: the chunks at or above the k-th best score. */
		cut = kth_largest(acc, k, live_only);
		accum_start(acc, &it);
		while ((e = accum_next(acc, &it)) != NULL)
		{
			Datum		values[2];
			bool		nulls[2] = {false, false};

			if ((live_only && !e->live) || e->score < cut)
				continue;
			values[0] = Int64GetDatum(e->seq);
			values[1] = Float8GetDatum(e->score);
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		}
	}
	note_memory();
	if (memory_peak.tracked)
		ereport(DEBUG1,
				(errmsg_internal("ragservice_bm25: memory peak %zu bytes above the call's start "
								 "(work_mem %d kB)",
								 memory_peak.peak - Min(memory_peak.start, memory_peak.peak),
								 work_mem)));
	SPI_finish();
	return (Datum) 0;
}

Datum
ragservice_bm25_topk(PG_FUNCTION_ARGS)
{
	postings_table = "public.chunk_postings";
	stats_table = "public.collection_text_stats";
	return topk(fcinfo, 0);
}

/*
 * `relid` quoted and qualified, when it is `table` or one of its Citus shards (`table`_<shard
 * id>) in the same schema; an error otherwise: the call reads no other table.
 */
static const char *
table_or_shard(Oid relid, const char *table)
{
	Oid			base = get_relname_relid(table, get_namespace_oid("public", false));
	char	   *name = get_rel_name(relid);
	Oid			schema = get_rel_namespace(relid);
	size_t		length = strlen(table);
	bool		fits = false;

	if (name != NULL && OidIsValid(base) && schema == get_rel_namespace(base))
	{
		if (strcmp(name, table) == 0)
			fits = true;
		else if (strncmp(name, table, length) == 0 && name[length] == '_'
				 && name[length + 1] != '\0'
				 && strspn(name + length + 1, "0123456789") == strlen(name + length + 1))
			fits = true;
	}
	if (!fits)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ragservice_bm25 reads public.%s or one of its shards, not %s",
						table, name != NULL ? name : "an unknown relation")));
	return quote_qualified_identifier(get_namespace_name(schema), name);
}

/*
 * The same over the given postings and totals tables: on a Citus worker, the shards of
 * chunk_postings and collection_text_stats that hold a tenant (a shard query may not start a
 * distributed one, so the function reads the shards themselves).
 */
Datum
ragservice_bm25_topk_in(PG_FUNCTION_ARGS)
{
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("ragservice_bm25_topk_in needs its postings and totals tables")));
	postings_table = table_or_shard(PG_GETARG_OID(0), "chunk_postings");
	stats_table = table_or_shard(PG_GETARG_OID(1), "collection_text_stats");
	return topk(fcinfo, 2);
}

Datum
ragservice_bm25_last_stats(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "ragservice_bm25_last_stats: a record type is expected");
	desc = BlessTupleDesc(desc);
	values[0] = Int64GetDatum(last_stats.blocks);
	values[1] = Int64GetDatum(last_stats.blocks_read);
	values[2] = Int64GetDatum(last_stats.postings_read);
	values[3] = Int32GetDatum(last_stats.rounds);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}
