// Batch encodings: a compact binary form (for the wire and checkpoints) and
// JSON (for the API and NDJSON dumps). Both round-trip exactly.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "engine/batch.h"
#include "rapidjson/fwd.h"

namespace entente::engine {

// Binary: appends the encoding of `b` (schema, rows, per-column data, event
// times, sequence numbers) to `out`.
void encode_batch(const Batch& b, std::string& out);
// Decodes one batch from the front of `in`, advancing it. Refuses
// truncated or inconsistent input with Errc::corrupt, and batches larger
// than `max_rows` with Errc::limit_exceeded.
Result<Batch> decode_batch(std::string_view& in, size_t max_rows = 1u << 24);

// Schema as JSON: [{"name":"price","type":"int64"}, ...].
std::string schema_to_json(const Schema& s);
Result<Schema> schema_from_json(const rapidjson::Value& v, std::string_view path = "$");

// One row as a JSON object: {"_seq":N,"_time":T,"field":value,...}. Doubles
// are written with enough digits to read back exactly.
void row_to_json(const Batch& b, size_t row, std::string& out);
// Every row as NDJSON (one object per line, '\n'-terminated).
void batch_to_ndjson(const Batch& b, std::string& out);
// Batch as JSON: {"schema":[...],"rows":[{...},...]}.
std::string batch_to_json(const Batch& b);
Result<Batch> batch_from_json(std::string_view text);

// Parses JSON objects (one per row) into a batch of `schema`. The event time
// comes from `_time` if present, else from field `time_field` (if not
// empty), else `default_time`; `_seq`, if present, is kept, else 0. Unknown
// fields and wrong types are errors naming the row (0-based) and field.
// The whole input is accepted or none of it.
Result<Batch> rows_from_json(const SchemaPtr& schema, const rapidjson::Value& array,
                             std::string_view time_field = {}, EventTime default_time = 0);

}  // namespace entente::engine
