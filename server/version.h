#ifndef KILN_SERVER_VERSION_H_
#define KILN_SERVER_VERSION_H_

namespace kiln {

// The kiln release. Reported by `kilnd --version`, in every CompileResponse and in Stats.
inline constexpr char kKilnVersion[] = "0.1.0";

}  // namespace kiln

#endif  // KILN_SERVER_VERSION_H_
