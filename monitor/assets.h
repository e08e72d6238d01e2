// The dashboard's static files, embedded in the binary at build time (monitor/assets.cpp): the
// page (monitor/dashboard/index.html) and Chart.js (Debian's libjs-chart.js). Nothing is read from
// disk or fetched at run time. Thread safety: immutable.
#pragma once
#include <string_view>

namespace tf::monitor {

std::string_view DashboardHtml();
std::string_view ChartJs();

}  // namespace tf::monitor
