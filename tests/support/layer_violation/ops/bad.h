// A fixture for scripts/check_layers.py: ops/ may not include model/.
#pragma once
#include "model/config.h"
