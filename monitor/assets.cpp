#include "monitor/assets.h"

// CMake passes the files' paths (TF_DASHBOARD_HTML_PATH, TF_CHARTJS_PATH) and rebuilds this file
// when either changes. .incbin copies their bytes into .rodata between begin/end symbols.
#if !defined(TF_DASHBOARD_HTML_PATH) || !defined(TF_CHARTJS_PATH)
#error "monitor/assets.cpp needs TF_DASHBOARD_HTML_PATH and TF_CHARTJS_PATH (set by CMakeLists.txt)"
#endif

#define TF_EMBED(name, path)                                  \
  __asm__(".section .rodata\n"                                \
          ".balign 16\n"                                      \
          ".global " #name "_begin\n" #name "_begin:\n"       \
          ".incbin \"" path "\"\n"                            \
          ".global " #name "_end\n" #name "_end:\n"           \
          ".byte 0\n"                                         \
          ".previous\n")

TF_EMBED(tf_dashboard_html, TF_DASHBOARD_HTML_PATH);
TF_EMBED(tf_chartjs, TF_CHARTJS_PATH);

extern "C" const char tf_dashboard_html_begin[], tf_dashboard_html_end[];
extern "C" const char tf_chartjs_begin[], tf_chartjs_end[];

namespace tf::monitor {

std::string_view DashboardHtml() {
  return {tf_dashboard_html_begin, static_cast<size_t>(tf_dashboard_html_end - tf_dashboard_html_begin)};
}
std::string_view ChartJs() { return {tf_chartjs_begin, static_cast<size_t>(tf_chartjs_end - tf_chartjs_begin)}; }

}  // namespace tf::monitor
