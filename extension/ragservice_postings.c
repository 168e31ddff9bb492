/*
 * ragservice_bm25_blocks: one statement's BM25 postings cut into blocks, in C.
 *
 * The postings triggers on `chunks` (migrations 0014, 0020, 0021, 0024) turn a statement's new
 * chunks into `chunk_postings` blocks: each chunk's tsvector gives its length (lexeme
 * occurrences) and, per lexeme, a tf and an impact tier; the postings are grouped by (lexeme,
 * tier), ordered by seq and cut into blocks of 128, each with its seq range, the largest tf and
 * the smallest length in it. In SQL that is an unnest, a sort of every posting and an array
 * aggregate per group: about three quarters of the trigger's time on a bulk load. This function
 * does the same from the tsvectors in one pass and one sort of plain structs, and returns the
 * same rows (the append-mode trigger of migration 0025 inserts them; the merging trigger and the
 * pack keep their SQL).
 *
 * The tier is ragservice_bm25_tier (migration 0014) in exact integer arithmetic:
 *     least(15, floor(8 * tf * 1.9 / (tf + 0.9 * (0.6 + 0.4 * len / 100.0))))
 *   = least(15, (152000 * tf) div (10000 * tf + 5400 + 36 * len))
 * (numerator and denominator times 10,000; the SQL computes in numeric, exactly but for the
 * last division, whose rounding is far below the 1 / denominator that separates a non-integer
 * quotient from an integer).
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "tsearch/ts_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/tuplestore.h"

PG_FUNCTION_INFO_V1(ragservice_bm25_blocks);

#define BLOCK_SIZE 128
#define MAX_TIER 15
#define BLOCK_COLUMNS 10

/* One posting: a lexeme (pointing into its chunk's tsvector) in one chunk. */
typedef struct Posting
{
	const char *lexeme;
	int64		seq;
	int32		len;			/* the chunk's length */
	int32		order;			/* the chunk's place in seq order: ties broken by it */
	uint16		lexeme_len;
	int16		tier;
	int16		tf;
} Posting;

/* A chunk: its seq and tsvector. */
typedef struct Chunk
{
	int64		seq;
	TSVector	tsv;
} Chunk;

static int
compare_chunk_seq(const void *a, const void *b)
{
	int64		x = ((const Chunk *) a)->seq;
	int64		y = ((const Chunk *) b)->seq;

	return (x > y) - (x < y);
}

/* (lexeme bytewise, as COLLATE "C"; tier; seq) */
static int
compare_posting(const void *a, const void *b)
{
	const Posting *x = (const Posting *) a;
	const Posting *y = (const Posting *) b;
	int			common = Min(x->lexeme_len, y->lexeme_len);
	int			c = memcmp(x->lexeme, y->lexeme, common);

	if (c != 0)
		return c;
	if (x->lexeme_len != y->lexeme_len)
		return x->lexeme_len < y->lexeme_len ? -1 : 1;
	if (x->tier != y->tier)
		return x->tier < y->tier ? -1 : 1;
	return (x->order > y->order) - (x->order < y->order);
}

static inline bool
same_key(const Posting *x, const Posting *y)
{
	return x->tier == y->tier && x->lexeme_len == y->lexeme_len &&
		memcmp(x->lexeme, y->lexeme, x->lexeme_len) == 0;
}

/* ragservice_bm25_tier(tf, len), exactly (see the head of this file). */
static inline int16
bm25_tier(int64 tf, int64 len)
{
	int64		tier = (152000 * tf) / (10000 * tf + 5400 + 36 * len);

	return (int16) Min(tier, MAX_TIER);
}

static inline int
entry_tf(TSVector tsv, WordEntry *entry)
{
	return entry->haspos ? POSDATALEN(tsv, entry) : 1;
}

/* ragservice_tsv_length: lexeme occurrences (one for a lexeme without positions). */
static int64
tsv_length(TSVector tsv)
{
	WordEntry  *entries = ARRPTR(tsv);
	int64		total = 0;

	for (int i = 0; i < tsv->size; i++)
		total += entry_tf(tsv, &entries[i]);
	return total;
}

/* The chunks of the two arrays (NULL elements are refused), in seq order. */
static Chunk *
read_chunks(ArrayType *seqs_array, ArrayType *tsvs_array, int *count)
{
	Datum	   *seq_datums;
	bool	   *seq_nulls;
	Datum	   *tsv_datums;
	bool	   *tsv_nulls;
	int			nseqs;
	int			ntsvs;
	int16		typlen;
	bool		typbyval;
	char		typalign;
	Chunk	   *chunks;

	if (ARR_NDIM(seqs_array) > 1 || ARR_NDIM(tsvs_array) > 1)
		ereport(ERROR, (errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
						errmsg("ragservice_bm25_blocks takes one-dimensional arrays")));
	deconstruct_array(seqs_array, INT8OID, sizeof(int64), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE,
					  &seq_datums, &seq_nulls, &nseqs);
	get_typlenbyvalalign(TSVECTOROID, &typlen, &typbyval, &typalign);
	deconstruct_array(tsvs_array, TSVECTOROID, typlen, typbyval, typalign,
					  &tsv_datums, &tsv_nulls, &ntsvs);
	if (nseqs != ntsvs)
		ereport(ERROR, (errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
						errmsg("ragservice_bm25_blocks: %d seqs but %d tsvectors", nseqs, ntsvs)));
	chunks = palloc(sizeof(Chunk) * Max(nseqs, 1));
	for (int i = 0; i < nseqs; i++)
	{
		CHECK_FOR_INTERRUPTS();
		if (seq_nulls[i] || tsv_nulls[i])
			ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
							errmsg("ragservice_bm25_blocks: a seq or tsvector is null")));
		chunks[i].seq = DatumGetInt64(seq_datums[i]);
		chunks[i].tsv = DatumGetTSVector(tsv_datums[i]);
	}
	qsort(chunks, nseqs, sizeof(Chunk), compare_chunk_seq);
	*count = nseqs;
	return chunks;
}

/* Every posting of the chunks, sorted by (lexeme, tier, seq). */
static Posting *
collect_postings(const Chunk *chunks, int nchunks, int64 *count)
{
	int64		total = 0;
	int64		next = 0;
	Posting    *postings;

	for (int c = 0; c < nchunks; c++)
		total += chunks[c].tsv->size;
	if ((Size) total > MaxAllocHugeSize / sizeof(Posting))
		ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
						errmsg("ragservice_bm25_blocks: too many postings in one call")));
	postings = palloc_extended(sizeof(Posting) * Max(total, 1), MCXT_ALLOC_HUGE);
	for (int c = 0; c < nchunks; c++)
	{
		TSVector	tsv = chunks[c].tsv;
		WordEntry  *entries = ARRPTR(tsv);
		int64		len;

		CHECK_FOR_INTERRUPTS();
		len = tsv_length(tsv);
		if (len > PG_INT32_MAX)
			ereport(ERROR, (errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
							errmsg("ragservice_bm25_blocks: a chunk is too long")));
		for (int i = 0; i < tsv->size; i++)
		{
			Posting    *p = &postings[next++];
			int			tf = entry_tf(tsv, &entries[i]);

			p->lexeme = STRPTR(tsv) + entries[i].pos;
			p->lexeme_len = entries[i].len;
			p->seq = chunks[c].seq;
			p->len = (int32) len;
			p->order = c;
			p->tf = (int16) tf;
			p->tier = bm25_tier(tf, len);
		}
	}
	qsort(postings, total, sizeof(Posting), compare_posting);
	*count = total;
	return postings;
}

/* One block row: postings[0 .. n) of one key. */
static void
put_block(ReturnSetInfo *rsinfo, const Posting *postings, int n)
{
	Datum		values[BLOCK_COLUMNS];
	bool		nulls[BLOCK_COLUMNS] = {false};
	Datum		seqs[BLOCK_SIZE];
	Datum		tfs[BLOCK_SIZE];
	Datum		lengths[BLOCK_SIZE];
	int16		max_tf = 0;
	int32		min_len = PG_INT32_MAX;

	for (int i = 0; i < n; i++)
	{
		seqs[i] = Int64GetDatum(postings[i].seq);
		tfs[i] = Int16GetDatum(postings[i].tf);
		lengths[i] = Int32GetDatum(postings[i].len);
		max_tf = Max(max_tf, postings[i].tf);
		min_len = Min(min_len, postings[i].len);
	}
	values[0] = PointerGetDatum(cstring_to_text_with_len(postings[0].lexeme,
														 postings[0].lexeme_len));
	values[1] = Int16GetDatum(postings[0].tier);
	values[2] = Int64GetDatum(postings[0].seq);
	values[3] = Int64GetDatum(postings[n - 1].seq);
	values[4] = Int32GetDatum(n);
	values[5] = PointerGetDatum(construct_array_builtin(seqs, n, INT8OID));
	values[6] = PointerGetDatum(construct_array_builtin(tfs, n, INT2OID));
	values[7] = PointerGetDatum(construct_array_builtin(lengths, n, INT4OID));
	values[8] = Int16GetDatum(max_tf);
	values[9] = Int32GetDatum(min_len);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

/*
 * ragservice_bm25_blocks(seqs bigint[], tsvs tsvector[]) RETURNS TABLE (lexeme text, tier
 * smallint, first_seq bigint, last_seq bigint, n integer, seqs bigint[], tfs smallint[],
 * lengths integer[], max_tf smallint, min_len integer): the blocks of the chunks' postings,
 * by lexeme, tier and seq.
 */
Datum
ragservice_bm25_blocks(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Chunk	   *chunks;
	int			nchunks;
	Posting    *postings;
	int64		npostings;
	int64		start = 0;

	InitMaterializedSRF(fcinfo, 0);
	chunks = read_chunks(PG_GETARG_ARRAYTYPE_P(0), PG_GETARG_ARRAYTYPE_P(1), &nchunks);
	postings = collect_postings(chunks, nchunks, &npostings);
	while (start < npostings)
	{
		int64		end = start + 1;

		CHECK_FOR_INTERRUPTS();
		while (end < npostings && same_key(&postings[start], &postings[end]))
			end++;
		for (int64 lo = start; lo < end; lo += BLOCK_SIZE)
			put_block(rsinfo, &postings[lo], (int) Min(BLOCK_SIZE, end - lo));
		start = end;
	}
	PG_RETURN_VOID();
}
