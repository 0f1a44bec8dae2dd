#pragma once
/// @file roofline.h
/// @brief Chapter 00: this machine's measured roofline, with accelerator presets and the
/// points that chapters measure.

#include <string>
#include <vector>

#include "common/ceiling.h"
#include "common/dtype.h"
#include "common/plot.h"

namespace inferlab::ch00 {

/// Decode-like (M = 1 GEMV) and prefill-like (M = 256 GEMM) matmuls timed with ops::matmul on
/// `device` with an N × K f32 weight (256 MiB by default, beyond any cache): two points that sit
/// on either side of the ridge.
std::vector<metrics::RooflinePoint> measure_matmul_points(Device device, const metrics::Ceiling& ceiling,
                                                          std::int64_t N = 8192, std::int64_t K = 8192);

/// Reads roofline points from JSON files the chapters write: either a top-level array or an
/// object with "roofline_points", each point {label, work: {flops, bytes}, seconds}.
std::vector<metrics::RooflinePoint> load_points(const std::string& path, const metrics::Ceiling& ceiling);

/// The roofline figure: one roof per ceiling (measured solid, datasheet dashed) and the points.
plot::Figure roofline_figure(const std::vector<metrics::Ceiling>& ceilings,
                             const std::vector<metrics::RooflinePoint>& points);

}  // namespace inferlab::ch00
