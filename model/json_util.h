// JSON reading for the model layer: the strict, depth-bounded reader of base/json.h (ParseJson,
// ReadJsonFile, QuoteForMessage, JsonForMessage, kMaxJsonDepth), which every layer shares.
#pragma once
#include "base/json.h"
