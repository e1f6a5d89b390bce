/// @file
/// The whole wrap layer: thin, move-only RAII wrappers over the core verbs objects.
#pragma once

#include <rdmaxx/wrap/ah.hpp>
#include <rdmaxx/wrap/context.hpp>
#include <rdmaxx/wrap/cq.hpp>
#include <rdmaxx/wrap/device.hpp>
#include <rdmaxx/wrap/error.hpp>
#include <rdmaxx/wrap/log.hpp>
#include <rdmaxx/wrap/mr.hpp>
#include <rdmaxx/wrap/mw.hpp>
#include <rdmaxx/wrap/pd.hpp>
#include <rdmaxx/wrap/pool.hpp>
#include <rdmaxx/wrap/qp.hpp>
#include <rdmaxx/wrap/srq.hpp>
