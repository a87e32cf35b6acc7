// The key, its TLS context, and the process's choice (tls.h). The tunnel
// that uses them is in tls_tunnel.cc.
#include "bootstrap/tls.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>

#include "braid/config.h"
#include "braid/error.h"
#include "core/errors.h"
#include "core/knobs.h"
#include "core/log.h"

#if BRAID_HAVE_TLS
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#endif

namespace braid::net {
namespace {

#if BRAID_HAVE_TLS
// Both ends name the key alike; a peer with another name has no key to offer.
constexpr char kIdentity[] = "braid-socket-key";
// TLS_AES_128_GCM_SHA256: the suite the pre-shared key is bound to.
constexpr unsigned char kSuite[] = {0x13, 0x01};

const TlsKey& keyOf(SSL* ssl) {
  return *static_cast<const TlsKey*>(SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl)));
}

// The session that carries the pre-shared key into TLS 1.3's key schedule.
SSL_SESSION* pskSession(SSL* ssl) {
  const SSL_CIPHER* suite = SSL_CIPHER_find(ssl, kSuite);
  if (!suite) return nullptr;
  SSL_SESSION* session = SSL_SESSION_new();
  if (!session) return nullptr;
  const auto& key = keyOf(ssl).bytes();
  if (!SSL_SESSION_set1_master_key(session, key.data(), key.size()) ||
      !SSL_SESSION_set_cipher(session, suite) ||
      !SSL_SESSION_set_protocol_version(session, TLS1_3_VERSION)) {
    SSL_SESSION_free(session);
    return nullptr;
  }
  return session;
}

// The client offers the key; `digest` is set when the server asked again
// (HelloRetryRequest) with a suite whose hash must match the key's.
int offerKey(SSL* ssl, const EVP_MD* digest, const unsigned char** identity, size_t* length,
             SSL_SESSION** session) {
  *session = nullptr;
  const SSL_CIPHER* suite = SSL_CIPHER_find(ssl, kSuite);
  if (digest && (!suite || SSL_CIPHER_get_handshake_digest(suite) != digest)) return 1;
  *session = pskSession(ssl);
  *identity = reinterpret_cast<const unsigned char*>(kIdentity);
  *length = sizeof(kIdentity) - 1;
  return *session ? 1 : 0;
}

// The server takes the key the client names; an unknown name gets none,
// and the handshake fails (there is no certificate to fall back on).
int findKey(SSL* ssl, const unsigned char* identity, size_t length, SSL_SESSION** session) {
  *session = nullptr;
  if (length != sizeof(kIdentity) - 1 || std::memcmp(identity, kIdentity, length) != 0) return 1;
  *session = pskSession(ssl);
  return *session ? 1 : 0;
}

SSL_CTX* makeContext(const TlsKey* key) {
  SSL_CTX* context = SSL_CTX_new(TLS_method());
  if (!context) return nullptr;
  // TLS 1.3 only, AES-GCM or ChaCha20 (both SHA-256, the key's hash), no
  // tickets (nothing is resumed), and a peer that vanishes reads as closed.
  bool ok =
      SSL_CTX_set_min_proto_version(context, TLS1_3_VERSION) &&
      SSL_CTX_set_max_proto_version(context, TLS1_3_VERSION) &&
      SSL_CTX_set_ciphersuites(context, "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256") &&
      SSL_CTX_set_num_tickets(context, 0) &&
      SSL_CTX_set_app_data(context, const_cast<TlsKey*>(key));
  if (!ok) {
    SSL_CTX_free(context);
    return nullptr;
  }
  SSL_CTX_set_options(context, SSL_OP_IGNORE_UNEXPECTED_EOF);
  SSL_CTX_set_psk_use_session_callback(context, offerKey);
  SSL_CTX_set_psk_find_session_callback(context, findKey);
  return context;
}

#endif

// The process's choice (tls.h).
struct Choice {
  std::mutex mutex;
  bool fixed = false;  // a socket was made under it
  bool read = false;   // BRAID_SOCKET_KEY_FILE was looked at
  std::shared_ptr<const TlsKey> key;
};

Choice& choice() {
  static Choice* one = new Choice;  // lives until exit: sockets may outlive statics
  return *one;
}

bool sameChoice(const TlsKey* a, const TlsKey* b) { return a == b || (a && b && *a == *b); }

// The secret in `path`, a trailing newline dropped.
std::string readSecret(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file)
    throw Error(ErrorCode::InvalidArgument,
                format("braid: BRAID_SOCKET_KEY_FILE=%s cannot be read: %s", path.c_str(),
                       std::strerror(errno)));
  std::string secret((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  return secret;
}

}  // namespace

bool tlsBuilt() { return BRAID_HAVE_TLS != 0; }

std::string openSslError() {
#if BRAID_HAVE_TLS
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code != 0) {
    char text[256];
    ERR_error_string_n(code, text, sizeof(text));
    return text;
  }
#endif
  return "";
}

std::shared_ptr<const TlsKey> TlsKey::fromSecret(std::string_view secret, const char* what) {
  if (!tlsBuilt())
    throw Error(ErrorCode::InvalidUsage,
                format("braid: %s: this braid was built without TLS (BRAID_TLS: OpenSSL 3, "
                       "libssl-dev), so it cannot encrypt its sockets",
                       what));
  if (secret.size() < kShortestSecret)
    throw Error(ErrorCode::InvalidArgument,
                format("braid: %s is %zu bytes long: a secret has at least %zu", what,
                       secret.size(), kShortestSecret));
  std::shared_ptr<TlsKey> key(new TlsKey);
#if BRAID_HAVE_TLS
  // PBKDF2 makes each guess at a secret cost what 10^5 hashes do: the
  // handshake shows a value derived from the key to anyone on the path.
  static constexpr char kSalt[] = "braid socket key v1";
  static constexpr int kIterations = 100000;
  const bool ok = PKCS5_PBKDF2_HMAC(secret.data(), static_cast<int>(secret.size()),
                                    reinterpret_cast<const unsigned char*>(kSalt),
                                    sizeof(kSalt) - 1, kIterations, EVP_sha256(),
                                    static_cast<int>(key->bytes_.size()), key->bytes_.data()) == 1;
  if (ok) key->context_ = makeContext(key.get());
  if (!ok || !key->context_)
    throw Error(ErrorCode::SystemError, format("braid: %s: OpenSSL could not set up TLS: %s", what,
                                               openSslError().c_str()));
#endif
  return key;
}

TlsKey::~TlsKey() {
#if BRAID_HAVE_TLS
  OPENSSL_cleanse(bytes_.data(), bytes_.size());
  SSL_CTX_free(static_cast<SSL_CTX*>(context_));
#endif
}

void setSocketKey(std::shared_ptr<const TlsKey> key) {
  Choice& c = choice();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.fixed && !sameChoice(c.key.get(), key.get()))
    throw Error(ErrorCode::InvalidUsage,
                format("braid: sockets were already made %s, so they cannot now be made %s: "
                       "choose before the first communicator (every process of a job alike)",
                       c.key ? "encrypted" : "in plaintext", key ? "encrypted" : "in plaintext"));
  c.key = std::move(key);
  c.read = true;  // the call overrides BRAID_SOCKET_KEY_FILE
}

std::shared_ptr<const TlsKey> socketKey() {
  Choice& c = choice();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (!c.read) {
    const std::string path = knobText("BRAID_SOCKET_KEY_FILE");
    if (!path.empty())
      c.key = TlsKey::fromSecret(readSecret(path), "the secret in BRAID_SOCKET_KEY_FILE");
    c.read = true;
    if (c.key) BRAID_INFO(Net, "sockets: TLS 1.3 with a pre-shared key");
  }
  c.fixed = true;
  return c.key;
}

}  // namespace braid::net

namespace braid {

void setSocketSecret(std::string_view secret) {
  net::setSocketKey(secret.empty() ? nullptr : net::TlsKey::fromSecret(secret, "the secret"));
}

}  // namespace braid
