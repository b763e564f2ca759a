/* The part of the XLA FFI C API (xla/ffi/api/c_api.h, API version 0.3, as shipped in
 * jaxlib's include directory) that fastring's FFI handler uses, declared here so that
 * building fastring needs no jaxlib.
 *
 * The C API is ABI-stable: every struct that crosses it starts with its own size, new fields
 * are only appended, and the sizes below (each struct up to its last field as of 0.3) are
 * what a caller's struct must at least cover. tests/test_jax.py compiles a probe against the
 * header of the installed jaxlib and checks every offset and size declared here against it.
 *
 * Only the leading fields we read or write are declared for XLA_FFI_Api (whose further
 * fields are function pointers we never call); every other struct is declared whole.
 */
#ifndef FASTRING_XLA_FFI_H_
#define FASTRING_XLA_FFI_H_

#include <stddef.h>
#include <stdint.h>

#define FASTRING_FFI_API_MAJOR 0
#define FASTRING_FFI_API_MINOR 3

typedef enum { XLA_FFI_Extension_Metadata = 1 } XLA_FFI_Extension_Type;

typedef struct XLA_FFI_Extension_Base {
  size_t struct_size;
  XLA_FFI_Extension_Type type;
  struct XLA_FFI_Extension_Base* next;
} XLA_FFI_Extension_Base;

typedef struct XLA_FFI_Api_Version {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  int major_version;
  int minor_version;
} XLA_FFI_Api_Version;

typedef struct XLA_FFI_Error XLA_FFI_Error; /* opaque, made by the API */

typedef enum {
  XLA_FFI_Error_Code_OK = 0,
  XLA_FFI_Error_Code_CANCELLED = 1,
  XLA_FFI_Error_Code_UNKNOWN = 2,
  XLA_FFI_Error_Code_INVALID_ARGUMENT = 3,
  XLA_FFI_Error_Code_FAILED_PRECONDITION = 9,
  XLA_FFI_Error_Code_INTERNAL = 13,
} XLA_FFI_Error_Code;

typedef struct XLA_FFI_Error_Create_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  const char* message; /* copied by the API */
  XLA_FFI_Error_Code errc;
} XLA_FFI_Error_Create_Args;

typedef XLA_FFI_Error* XLA_FFI_Error_Create(XLA_FFI_Error_Create_Args* args);
typedef XLA_FFI_Error_Create* XLA_FFI_Error_Create_Ptr; /* a name for Cython */

typedef enum {
  XLA_FFI_DataType_PRED = 1,
  XLA_FFI_DataType_S8 = 2,
  XLA_FFI_DataType_S16 = 3,
  XLA_FFI_DataType_S32 = 4,
  XLA_FFI_DataType_S64 = 5,
  XLA_FFI_DataType_U8 = 6,
  XLA_FFI_DataType_U16 = 7,
  XLA_FFI_DataType_U32 = 8,
  XLA_FFI_DataType_U64 = 9,
  XLA_FFI_DataType_F16 = 10,
  XLA_FFI_DataType_F32 = 11,
  XLA_FFI_DataType_F64 = 12,
  XLA_FFI_DataType_C64 = 15,
  XLA_FFI_DataType_BF16 = 16,
  XLA_FFI_DataType_TOKEN = 17,
  XLA_FFI_DataType_C128 = 18,
} XLA_FFI_DataType;

typedef struct XLA_FFI_Buffer {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_DataType dtype;
  void* data;
  int64_t rank;
  int64_t* dims;
} XLA_FFI_Buffer;

typedef enum { XLA_FFI_ArgType_BUFFER = 1 } XLA_FFI_ArgType;
typedef enum { XLA_FFI_RetType_BUFFER = 1 } XLA_FFI_RetType;
typedef enum {
  XLA_FFI_AttrType_ARRAY = 1,
  XLA_FFI_AttrType_DICTIONARY = 2,
  XLA_FFI_AttrType_SCALAR = 3,
  XLA_FFI_AttrType_STRING = 4,
} XLA_FFI_AttrType;

typedef struct XLA_FFI_ByteSpan {
  const char* ptr;
  size_t len;
} XLA_FFI_ByteSpan;

typedef struct XLA_FFI_TypeId {
  int64_t type_id;
} XLA_FFI_TypeId;

typedef enum {
  XLA_FFI_ExecutionStage_INSTANTIATE = 0,
  XLA_FFI_ExecutionStage_PREPARE = 1,
  XLA_FFI_ExecutionStage_INITIALIZE = 2,
  XLA_FFI_ExecutionStage_EXECUTE = 3,
} XLA_FFI_ExecutionStage;

typedef struct XLA_FFI_Args {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  int64_t size;
  XLA_FFI_ArgType* types;
  void** args;
} XLA_FFI_Args;

typedef struct XLA_FFI_Rets {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  int64_t size;
  XLA_FFI_RetType* types;
  void** rets;
} XLA_FFI_Rets;

typedef struct XLA_FFI_Attrs {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  int64_t size;
  XLA_FFI_AttrType* types;
  XLA_FFI_ByteSpan** names;
  void** attrs;
} XLA_FFI_Attrs;

/* Only the leading fields; see the note at the top. */
typedef struct XLA_FFI_Api {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  XLA_FFI_Api_Version api_version;
  const void* internal_api;
  XLA_FFI_Error_Create_Ptr XLA_FFI_Error_Create;
} XLA_FFI_Api;

typedef struct XLA_FFI_CallFrame {
  size_t struct_size;
  XLA_FFI_Extension_Base* extension_start;
  const XLA_FFI_Api* api;
  void* ctx;
  XLA_FFI_ExecutionStage stage;
  XLA_FFI_Args args;
  XLA_FFI_Rets rets;
  XLA_FFI_Attrs attrs;
  void* future;
} XLA_FFI_CallFrame;

typedef uint32_t XLA_FFI_Handler_Traits;

typedef struct XLA_FFI_Metadata {
  size_t struct_size;
  XLA_FFI_Api_Version api_version;
  XLA_FFI_Handler_Traits traits;
  XLA_FFI_TypeId state_type_id;
} XLA_FFI_Metadata;

typedef struct XLA_FFI_Metadata_Extension {
  XLA_FFI_Extension_Base extension_base;
  XLA_FFI_Metadata* metadata;
} XLA_FFI_Metadata_Extension;

/* A struct's size up to and including `field`: what the API calls its STRUCT_SIZE when
 * `field` is the struct's last field in the API version above. */
#define FASTRING_FFI_SIZE_TO(type, field) (offsetof(type, field) + sizeof(((type*)0)->field))

/* The least size of each struct the handler reads or fills, and of the API table up to the
 * one function it calls. */
#define FASTRING_FFI_CALL_FRAME_SIZE FASTRING_FFI_SIZE_TO(XLA_FFI_CallFrame, attrs)
#define FASTRING_FFI_BUFFER_SIZE FASTRING_FFI_SIZE_TO(XLA_FFI_Buffer, dims)
#define FASTRING_FFI_API_SIZE FASTRING_FFI_SIZE_TO(XLA_FFI_Api, XLA_FFI_Error_Create)
#define FASTRING_FFI_METADATA_SIZE FASTRING_FFI_SIZE_TO(XLA_FFI_Metadata, traits)
#define FASTRING_FFI_METADATA_WITH_STATE_SIZE FASTRING_FFI_SIZE_TO(XLA_FFI_Metadata, state_type_id)
#define FASTRING_FFI_METADATA_EXTENSION_SIZE FASTRING_FFI_SIZE_TO(XLA_FFI_Metadata_Extension, metadata)
#define FASTRING_FFI_ERROR_CREATE_ARGS_SIZE FASTRING_FFI_SIZE_TO(XLA_FFI_Error_Create_Args, errc)
#define FASTRING_FFI_API_VERSION_SIZE FASTRING_FFI_SIZE_TO(XLA_FFI_Api_Version, minor_version)

#endif /* FASTRING_XLA_FFI_H_ */
