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

#define SH_PREFIX acc
#define SH_ELEMENT_TYPE Accum
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
 * hash. The array is calloc'd (fresh pages are zero without being written) and freed with the
 * memory context that holds the accumulator.
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
 * A backend keeps one zeroed buffer of up to 32 MB between calls: a fresh one per call costs a
 * page fault per 4 KB, more than clearing the part in use.
 */
#define KEPT_BYTES_MAX ((size_t) 32 << 20)

static void *kept_buffer = NULL;
static size_t kept_capacity = 0;
static bool kept_in_use = false;

static void
free_buffer(void *arg)
{
	free(arg);
}

static void
release_kept_buffer(void *arg)
{
	kept_in_use = false;
}

/*
 * `bytes` of zeroes, freed (or handed back) with the current memory context; NULL when the
 * memory is not there.
 */
static void *
allocate_zeroed(size_t bytes)
{
	MemoryContextCallback *cb = palloc(sizeof(MemoryContextCallback));

	if (bytes <= KEPT_BYTES_MAX && !kept_in_use)
	{
		if (kept_capacity < bytes)
		{
			free(kept_buffer);
			kept_capacity = 0;
			kept_buffer = malloc(bytes);
			if (kept_buffer == NULL)
				return NULL;
			kept_capacity = bytes;
		}
		memset(kept_buffer, 0, bytes);
		kept_in_use = true;
		cb->func = release_kept_buffer;
		cb->arg = NULL;
		MemoryContextRegisterResetCallback(CurrentMemoryContext, cb);
		return kept_buffer;
	}
	cb->arg = calloc(bytes, 1);
	if (cb->arg == NULL)
		return NULL;
	cb->func = free_buffer;
	MemoryContextRegisterResetCallback(CurrentMemoryContext, cb);
	return cb->arg;
}

static Accumulator *
accum_create(int64 first_seq, int64 last_seq, int64 postings)
{
	Accumulator *a = palloc0(sizeof(Accumulator));
	int64		range = last_seq - first_seq + 1;

	a->base = first_seq;
	a->range = range;

	if (postings > 0 && range > 0 && range <= DENSE_MAX_RANGE
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
	 * Sized for half the postings up front (at most 1M chunks): a query that reads most of them
	 * rehashes once at most as it fills, one that prunes does not zero much it never uses.
	 */
	a->hash = acc_create(CurrentMemoryContext,
						 (uint32) Min(Max(postings / 2, 1024), INT64CONST(1) << 20), NULL);
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
		e = &a->slots[seq - a->base];
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
	if (seq < a->base || seq - a->base >= a->range)
		return NULL;
	e = &a->slots[seq - a->base];
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
	uint64		off = (uint64) (seq - a->base);

	return off < (uint64) a->range
		&& (a->live_bits[off >> 6] & (UINT64CONST(1) << (off & 63))) != 0;
}

static inline void
set_live_bit(Accumulator *a, int64 seq, bool live)
{
	uint64		off = (uint64) (seq - a->base);
	uint64		mask = UINT64CONST(1) << (off & 63);

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
	"SELECT p.collection_id, p.lexeme, p.tier, p.first_seq, p.seqs, p.tfs, p.lengths "
	"FROM unnest($1::uuid[], $2::text[], $3::int2[], $4::int8[]) "
	"     AS k(collection_id, lexeme, tier, first_seq) "
	"CROSS JOIN LATERAL (SELECT p.* FROM public.chunk_postings p "
	"                    WHERE p.collection_id = k.collection_id AND p.lexeme = k.lexeme "
	"                      AND p.tier = k.tier AND p.first_seq = k.first_seq OFFSET 0) AS p";

static const char *BLOCKS_BY_SCAN =
	"SELECT p.collection_id, p.lexeme, p.tier, p.first_seq, p.seqs, p.tfs, p.lengths "
	"FROM public.chunk_postings p "
	"WHERE p.collection_id = ANY($1) AND p.lexeme = ANY($2) AND p.tier = ANY($3) "
	"  AND p.first_seq = ANY($4)";

/* Every block of the terms, in the primary key's order (the exhaustive path). */
static const char *BLOCKS_OF_TERMS =
	"SELECT p.collection_id, p.lexeme, p.tier, p.first_seq, p.seqs, p.tfs, p.lengths "
	"FROM public.chunk_postings p WHERE p.collection_id = ANY($1) AND p.lexeme = ANY($2)";

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
		ScoredSeq	v = {e->score, e->seq};

		heap_offer_scored(heap, &size, k, v);
	}
	for (i = 0; i < leaders->ntop; i++)
	{
		Accum	   *e = accum_find(acc, leaders->top[i]);
		ScoredSeq	v = {e->score, e->seq};

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
	int			n;
	const int64 *seqs;
	const int16 *tfs;
	const int32 *lengths;
} BlockRow;

/* Adds a block's postings to the chunks' scores; see read_blocks. */
static void
add_block_postings(const BlockRow *row, const Term *terms, const Scoring *scoring,
				   Accumulator *acc, Leaders *leaders)
{
	const Term *term = &terms[row->term];
	int			n = row->n;
	const int64 *seq = row->seqs;
	const int16 *tf = row->tfs;
	const int32 *len = row->lengths;
	uint32		bit = SEEN_BIT(row->term);
	int			j;

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
typedef void (*BlockRowHandler) (const BlockRow *row, void *arg);

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
	int			i;

	CHECK_FOR_INTERRUPTS();
	slot_getsomeattrs(slot, 7);
	for (i = 0; i < 7; i++)
		if (slot->tts_isnull[i])
			elog(ERROR, "ragservice_bm25: malformed postings block");
	row.term = find_term(r->terms, r->nterms, DatumGetTextPP(slot->tts_values[1]), r->hint);
	if (row.term < 0)
		return true;
	r->hint = row.term;
	old = MemoryContextSwitchTo(r->row_context);
	row.collection = DatumGetUUIDP(slot->tts_values[0]);
	row.tier = DatumGetInt16(slot->tts_values[2]);
	row.first_seq = DatumGetInt64(slot->tts_values[3]);
	seqs = DatumGetArrayTypeP(slot->tts_values[4]);
	tfs = DatumGetArrayTypeP(slot->tts_values[5]);
	lengths = DatumGetArrayTypeP(slot->tts_values[6]);
	row.n = ArrayGetNItems(ARR_NDIM(seqs), ARR_DIMS(seqs));
	if (ARR_HASNULL(seqs) || ARR_HASNULL(tfs) || ARR_HASNULL(lengths)
		|| ARR_ELEMTYPE(seqs) != INT8OID || ARR_ELEMTYPE(tfs) != INT2OID
		|| ARR_ELEMTYPE(lengths) != INT4OID
		|| ArrayGetNItems(ARR_NDIM(tfs), ARR_DIMS(tfs)) != row.n
		|| ArrayGetNItems(ARR_NDIM(lengths), ARR_DIMS(lengths)) != row.n)
		elog(ERROR, "ragservice_bm25: malformed postings block");
	row.seqs = (const int64 *) ARR_DATA_PTR(seqs);
	row.tfs = (const int16 *) ARR_DATA_PTR(tfs);
	row.lengths = (const int32 *) ARR_DATA_PTR(lengths);
	r->handle(&row, r->arg);
	MemoryContextSwitchTo(old);
	MemoryContextReset(r->row_context);
	return true;
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
} BatchTarget;

static void
add_batch_row(const BlockRow *row, void *arg)
{
	BatchTarget *target = (BatchTarget *) arg;

	/* a key of the scan's cross product that is not in the batch is left alone */
	if (batch_block(target->batch, target->count, row) != NULL)
		add_block_postings(row, target->terms, target->scoring, target->acc, target->leaders);
}

/*
 * Reads the given blocks and adds their postings to the chunks' scores: to every chunk (new
 * ones entered, each noted in `leaders`) in phase 2, else (NULL) only to the live chunks
 * already there. Sorts the batch by key.
 */
static void
read_blocks(const BlockReader *reader, PostingsBlock **batch, int count, const Term *terms,
			int nterms, const Scoring *scoring, Accumulator *acc, Leaders *leaders)
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
	BatchTarget target = {batch, count, terms, scoring, acc, leaders};
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
	int			rc;

	rc = SPI_execute_with_args(
		"SELECT coalesce(sum(chunk_count), 0)::float8, coalesce(sum(token_count), 0)::float8 "
		"FROM public.collection_text_stats WHERE collection_id = ANY($1)",
		1, types, args, NULL, true, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "ragservice_bm25: reading the collections' totals failed");
	chunks = DatumGetFloat8(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	tokens = DatumGetFloat8(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	SPI_freetuptable(SPI_tuptable);
	*n = chunks;
	*avgdl = tokens / Max(chunks, 1.0);
}

/* Every block of the terms in the collections, with its bound; the terms' df and idf. */
static int
read_block_bounds(Datum collections, Datum terms_datum, Term *terms, int nterms,
				  const Scoring *scoring, double n, PostingsBlock **out)
{
	Oid			types[2] = {UUIDARRAYOID, TEXTARRAYOID};
	Datum		args[2] = {collections, terms_datum};
	PostingsBlock	   *blocks;
	int			nblocks = 0;
	int			hint = -1;
	uint64		row;
	int			rc;
	int			i;

	rc = SPI_execute_with_args(
		"SELECT p.collection_id, p.lexeme, p.tier, p.first_seq, p.last_seq, p.n, p.max_tf, "
		"p.min_len FROM public.chunk_postings p "
		"WHERE p.collection_id = ANY($1) AND p.lexeme = ANY($2)",
		2, types, args, NULL, true, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "ragservice_bm25: reading postings bounds failed");
	blocks = palloc(sizeof(PostingsBlock) * Max(SPI_processed, 1));
	for (row = 0; row < SPI_processed; row++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[row];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		PostingsBlock	   *block = &blocks[nblocks];
		int			t = find_term(terms, nterms,
								  DatumGetTextPP(SPI_getbinval(tuple, desc, 2, &isnull)), hint);

		if (t < 0)
			continue;
		hint = t;
		memcpy(&block->collection, DatumGetUUIDP(SPI_getbinval(tuple, desc, 1, &isnull)),
			   sizeof(pg_uuid_t));
		block->term = t;
		block->tier = DatumGetInt16(SPI_getbinval(tuple, desc, 3, &isnull));
		block->first_seq = DatumGetInt64(SPI_getbinval(tuple, desc, 4, &isnull));
		block->last_seq = DatumGetInt64(SPI_getbinval(tuple, desc, 5, &isnull));
		block->n = DatumGetInt32(SPI_getbinval(tuple, desc, 6, &isnull));
		block->max_tf = DatumGetInt16(SPI_getbinval(tuple, desc, 7, &isnull));
		block->min_len = DatumGetInt32(SPI_getbinval(tuple, desc, 8, &isnull));
		block->read = false;
		terms[t].df += block->n;
		nblocks++;
	}
	SPI_freetuptable(SPI_tuptable);

	for (i = 0; i < nterms; i++)
		terms[i].idf_weight = terms[i].weight
			* log(1 + (n - terms[i].df + 0.5) / (terms[i].df + 0.5));
	for (i = 0; i < nblocks; i++)
		blocks[i].bound = terms[blocks[i].term].idf_weight
			* term_part(scoring, blocks[i].max_tf, blocks[i].min_len);
	*out = blocks;
	return nblocks;
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
 */
static bool
complete_live_chunks(const BlockReader *reader, Accumulator *acc, Term *terms, int nterms,
					 PostingsBlock *blocks, int nblocks, int64 postings, int k,
					 const Scoring *scoring, PostingsBlock **batch, bool may_give_up)
{
	Accum	  **live = palloc_extended(sizeof(Accum *) * Max(accum_count(acc), 1), MCXT_ALLOC_HUGE);
	int64	  **wanted = palloc(sizeof(int64 *) * nterms);
	int		   *nwanted = palloc0(sizeof(int) * nterms);
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
		wanted[t] = palloc(sizeof(int64) * Max(nlive, 1));

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
			return false;		/* cheaper exhaustive: see score_exhaustively */
		read_blocks(reader, batch, all ? count : Min(count, round_size), terms, nterms, scoring,
					acc, NULL);
		last_stats.rounds++;
		round_size *= 2;
		if (all)
			break;
	}
	return true;
}

/* The chunks at or above the k-th best score, with their scores. */
typedef struct Results
{
	int64	   *seqs;
	double	   *scores;
	int			count;
} Results;

/* Whether the exhaustive path's dense array suits the seq range. */
static bool
exhaustive_fits(int64 first_seq, int64 last_seq, int64 postings)
{
	int64		range = last_seq - first_seq + 1;

	return postings > 0 && range > 0 && range <= EXHAUSTIVE_MAX_RANGE
		&& range <= EXHAUSTIVE_SLOTS_PER_POSTING * postings;
}

/* The exhaustive path's scores: a slot per seq from base, and a bit per seen chunk. */
typedef struct DenseScores
{
	const Term *terms;
	const Scoring *scoring;
	double	   *scores;
	uint64	   *seen;
	int64		base;
	int64		range;
} DenseScores;

/* Adds a row of BLOCKS_OF_TERMS to the dense scores and marks its chunks seen. */
static void
add_dense_row(const BlockRow *row, void *arg)
{
	DenseScores *d = (DenseScores *) arg;
	double		idf_weight = d->terms[row->term].idf_weight;
	double	   *scores = d->scores;
	uint64	   *seen = d->seen;
	int			j;

	for (j = 0; j < row->n; j++)
	{
		uint64		off = (uint64) (row->seqs[j] - d->base);

		/* the blocks' bounds were read in the same snapshot: every seq is in the range */
		if (off >= (uint64) d->range)
			elog(ERROR, "ragservice_bm25: a posting outside its blocks' seq range");
		scores[off] += idf_weight * term_part(d->scoring, row->tfs[j], row->lengths[j]);
		seen[off >> 6] |= UINT64CONST(1) << (off & 63);
	}
	last_stats.postings_read += row->n;
	last_stats.blocks_read++;
}

/*
 * Exhaustive BM25 when the bounds do not pay: every block of the terms in one scan of the
 * primary key (a third of the cost a block of reading them by key, and none of the pruning's
 * bookkeeping), each posting added to a dense array of scores over the seq range; then the
 * seen chunks at or above the k-th best score.
 */
static void
score_exhaustively(SPIPlanPtr plan, Datum collections, Datum terms_datum, const Term *terms,
				   int nterms, const Scoring *scoring, int64 base, int64 range, int k,
				   Results *out)
{
	DenseScores d = {terms, scoring, NULL, NULL, base, range};
	Datum		args[2] = {collections, terms_datum};
	Oid			types[2] = {UUIDARRAYOID, TEXTARRAYOID};
	ScoredSeq  *heap = palloc(sizeof(ScoredSeq) * k);
	int			size = 0;
	double		cut;
	BitWalk		walk;
	int64		off;

	d.scores = allocate_zeroed(sizeof(double) * (size_t) range);
	if (d.scores == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("ragservice_bm25: out of memory for %lld scores", (long long) range)));
	d.seen = palloc0(sizeof(uint64) * ((range + 63) / 64));
	run_blocks_query(plan, 2, args, types, terms, nterms, add_dense_row, &d);
	last_stats.rounds++;

	walk = bit_walk(d.seen, range);
	while (bit_walk_next(&walk, &off))
		if (size < k || d.scores[off] > heap[0].score)
			heap_offer_scored(heap, &size, k, (ScoredSeq) {d.scores[off], base + off});
	cut = size < k ? -INFINITY : heap[0].score;
	out->count = 0;
	walk = bit_walk(d.seen, range);
	while (bit_walk_next(&walk, &off))
		out->count += d.scores[off] >= cut;
	out->seqs = SPI_palloc(sizeof(int64) * (size_t) Max(out->count, 1));
	out->scores = SPI_palloc(sizeof(double) * (size_t) Max(out->count, 1));
	out->count = 0;
	walk = bit_walk(d.seen, range);
	while (bit_walk_next(&walk, &off))
	{
		if (d.scores[off] < cut)
			continue;
		out->seqs[out->count] = base + off;
		out->scores[out->count] = d.scores[off];
		out->count++;
	}
	pfree(heap);
}

/*
 * A statement planned once for any parameters: a custom plan would plan again for every call,
 * with arrays of thousands of keys.
 */
static SPIPlanPtr
prepare_generic(const char *query, int nargs, Oid *types)
{
	SPIPlanPtr	plan = SPI_prepare_cursor(query, nargs, types, CURSOR_OPT_GENERIC_PLAN);

	if (plan == NULL)
		elog(ERROR, "ragservice_bm25: preparing a blocks query failed: %s",
			 SPI_result_code_string(SPI_result));
	return plan;
}

Datum
ragservice_bm25_topk(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum		collections;
	Datum		terms_datum;
	Term	   *terms;
	int			nterms;
	int			k;
	Scoring		scoring;
	double		n;
	PostingsBlock	   *blocks;
	PostingsBlock	  **batch;
	int			nblocks;
	int			round_size = FIRST_ROUND;
	int64		postings = 0;
	Leaders		leaders;
	bool		prune;
	bool		live_only = false;
	double		cut;
	BlockReader reader;
	Accumulator *acc;
	Results		results;
	bool		dense;
	bool		may_give_up;
	bool		exhaustive;
	MemoryContext outer;
	MemoryContext pruning;
	AccumIterator it;
	Accum	   *e;
	int64		first_seq = PG_INT64_MAX;
	int64		last_seq = PG_INT64_MIN;
	int			i;
	Oid			block_types[4] = {UUIDARRAYOID, TEXTARRAYOID, INT2ARRAYOID, INT8ARRAYOID};
	Oid			term_types[2] = {UUIDARRAYOID, TEXTARRAYOID};

	InitMaterializedSRF(fcinfo, 0);
	memset(&last_stats, 0, sizeof(last_stats));
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(3) || PG_ARGISNULL(4) || PG_ARGISNULL(5))
		return (Datum) 0;
	collections = PG_GETARG_DATUM(0);
	terms_datum = PG_GETARG_DATUM(1);
	k = PG_GETARG_INT32(3);
	scoring.k1 = PG_GETARG_FLOAT8(4);
	scoring.b = PG_GETARG_FLOAT8(5);
	if (k <= 0)
		return (Datum) 0;
	if (k > MAX_K)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("k must be at most %d", MAX_K)));
	nterms = collect_terms(PG_GETARG_ARRAYTYPE_P(1),
						   PG_ARGISNULL(2) ? NULL : PG_GETARG_ARRAYTYPE_P(2), &terms);
	if (nterms == 0)
		return (Datum) 0;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "ragservice_bm25: SPI_connect failed");
	read_totals(collections, &n, &scoring.avgdl);
	set_length_norm(&scoring);
	nblocks = read_block_bounds(collections, terms_datum, terms, nterms, &scoring, n, &blocks);
	last_stats.blocks = nblocks;
	for (i = 0; i < nblocks; i++)
		postings += blocks[i].n;
	prune = bounds_hold(terms, nterms, &scoring);
	if (prune)
		qsort(blocks, nblocks, sizeof(PostingsBlock), compare_bound_desc);

	reader.by_lookup = prepare_generic(BLOCKS_BY_LOOKUP, 4, block_types);
	reader.by_scan = prepare_generic(BLOCKS_BY_SCAN, 4, block_types);
	for (i = 0; i < nblocks; i++)
	{
		first_seq = Min(first_seq, blocks[i].first_seq);
		last_seq = Max(last_seq, blocks[i].last_seq);
	}
	dense = accumulator_choice != ACCUMULATOR_HASH
		&& (accumulator_choice == ACCUMULATOR_ARRAY
			? postings > 0 && last_seq - first_seq < EXHAUSTIVE_MAX_RANGE
			: exhaustive_fits(first_seq, last_seq, postings));
	exhaustive = !prune && dense;
	may_give_up = dense && postings >= exhaustive_min_postings;

	/* the pruning's memory, given back at once if it gives up (the exhaustive path reuses it) */
	outer = CurrentMemoryContext;
	pruning = AllocSetContextCreate(outer, "ragservice_bm25 pruning", ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(pruning);
	acc = accum_create(first_seq, last_seq, postings);
	batch = palloc(sizeof(PostingsBlock *) * Max(nblocks, 1));
	leaders.capacity = 1024;
	leaders.touched = palloc(sizeof(int64) * leaders.capacity);
	leaders.ntouched = 0;
	leaders.top = palloc(sizeof(int64) * k);
	leaders.ntop = 0;
	leaders.round = 1;

	/*
	 * Phase 2: the blocks with the highest bounds first, in rounds, from the essential terms only
	 * (MaxScore: a chunk found only in the non-essential terms, whose highest unread bounds add
	 * up to less than theta, cannot enter the top k), until no essential term is left.
	 */
	for (i = 0; i < nterms; i++)
		terms[i].essential = true;
	while (!exhaustive)
	{
		int			count = 0;
		double		theta;

		for (i = 0; i < nblocks && (!prune || count < round_size); i++)
			if (!blocks[i].read && terms[blocks[i].term].essential)
				batch[count++] = &blocks[i];
		if (count == 0)
			break;
		read_blocks(&reader, batch, count, terms, nterms, &scoring, acc, &leaders);
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
			if (count > 0)
				read_blocks(&reader, batch, count, terms, nterms, &scoring, acc, &leaders);
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
										   k, &scoring, batch, may_give_up);
		live_only = true;
	}

	if (exhaustive)
	{
		MemoryContextSwitchTo(outer);
		MemoryContextDelete(pruning);
		score_exhaustively(prepare_generic(BLOCKS_OF_TERMS, 2, term_types), collections,
						   terms_datum, terms, nterms, &scoring, first_seq,
						   last_seq - first_seq + 1, k, &results);
	}
	else
	{
		/* Phase 4: the chunks at or above the k-th best score. */
		cut = kth_largest(acc, k, live_only);
		results.seqs = SPI_palloc(sizeof(int64) * Max(accum_count(acc), 1));
		results.scores = SPI_palloc(sizeof(double) * Max(accum_count(acc), 1));
		results.count = 0;
		accum_start(acc, &it);
		while ((e = accum_next(acc, &it)) != NULL)
		{
			if ((live_only && !e->live) || e->score < cut)
				continue;
			results.seqs[results.count] = e->seq;
			results.scores[results.count] = e->score;
			results.count++;
		}
		MemoryContextSwitchTo(outer);
	}
	SPI_finish();

	for (i = 0; i < results.count; i++)
	{
		Datum		values[2];
		bool		nulls[2] = {false, false};

		values[0] = Int64GetDatum(results.seqs[i]);
		values[1] = Float8GetDatum(results.scores[i]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
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
