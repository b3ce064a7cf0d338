#pragma once
// The node's Prometheus registry is base::Registry (base/metrics.h), shared
// with federation/, which registers its own metrics; the broker keeps its
// names for it.

#include "base/metrics.h"

namespace entente::broker {

using base::Counter;
using base::Gauge;
using base::Histogram;
using base::Labels;
using base::latency_buckets;
using base::MetricsWriter;
using base::Registry;

}  // namespace entente::broker
