/* A stand-in libcuda for ci/abi-check.sh: compiled against the real cuda.h,
 * it answers one unicast lifecycle (reserve, limits, create, query, export,
 * allocate, bind, unbind, destroy, release), and exports and imports the
 * allocation (a POSIX descriptor by value, fabric bytes by pointer, then
 * the importer's probe map), and checks the arguments it
 * gets, so the real backend's loading, symbol resolution and marshalling
 * run end to end without a GPU. Not a model of the driver: that is
 * src/model. */
#include <cuda.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
static CUcontext cur = 0; static int dummy;
CUresult cuInit(unsigned int f){return f?CUDA_ERROR_INVALID_VALUE:CUDA_SUCCESS;}
CUresult cuDriverGetVersion(int*v){*v=13030;return 0;}
CUresult cuDeviceGetCount(int*c){*c=1;return 0;}
CUresult cuDeviceGetAttribute(int*pi, CUdevice_attribute a, CUdevice d){if(d!=0)return CUDA_ERROR_INVALID_DEVICE; *pi = (a==134)?0:1; return 0;}
CUresult cuCtxGetCurrent(CUcontext*c){*c=cur;return 0;}
CUresult cuCtxSetCurrent(CUcontext c){cur=c;return 0;}
CUresult cuDevicePrimaryCtxRetain(CUcontext*c, CUdevice d){if(d)return CUDA_ERROR_INVALID_DEVICE;*c=(CUcontext)&dummy;return 0;}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d){return 0;}
CUresult cuMemGetInfo_v2(size_t*f,size_t*t){if(!cur)return CUDA_ERROR_INVALID_CONTEXT;*f=1<<30;*t=1<<30;return 0;}
CUresult cuLogicalEndpointIdReserve(CUlogicalEndpointId*b, cuuint32_t n){if(!cur)return CUDA_ERROR_INVALID_CONTEXT;*b=7;return 0;}
CUresult cuLogicalEndpointIdRelease(CUlogicalEndpointId b, cuuint32_t n){return b==7?0:CUDA_ERROR_INVALID_VALUE;}
CUresult cuLogicalEndpointGetLimits(cuuint64_t*a,cuuint64_t*m,const CUlogicalEndpointProp*p){if(p->type!=CU_LOGICAL_ENDPOINT_TYPE_UNICAST||p->unicast.device!=0)return CUDA_ERROR_INVALID_VALUE;*a=2<<20;*m=1<<30;return 0;}
CUresult cuLogicalEndpointCreate(CUlogicalEndpointId id,const CUlogicalEndpointProp*p){return (id==7&&p->size==(2<<20)&&p->ipcHandleTypes==1&&p->flags==0)?0:CUDA_ERROR_INVALID_VALUE;}
CUresult cuLogicalEndpointQuery(CUlogicalEndpointId b, cuuint32_t n, int*s){*s=1;return 0;}
CUresult cuLogicalEndpointExport(void*h, CUlogicalEndpointId id, CUlogicalEndpointIpcHandleType t){if(t!=CU_LOGICAL_ENDPOINT_IPC_HANDLE_TYPE_FABRIC)return CUDA_ERROR_INVALID_VALUE;memset(h,0xab,64);return 0;}
CUresult cuLogicalEndpointDestroy(CUlogicalEndpointId id){return id==7?0:CUDA_ERROR_INVALID_VALUE;}
CUresult cuMemGetAllocationGranularity(size_t*g,const CUmemAllocationProp*p,CUmemAllocationGranularity_flags o){*g=2<<20;return p->location.type==CU_MEM_LOCATION_TYPE_DEVICE?0:CUDA_ERROR_INVALID_VALUE;}
CUresult cuMemCreate(CUmemGenericAllocationHandle*h,size_t s,const CUmemAllocationProp*p,unsigned long long f){*h=0x1234;return 0;}
CUresult cuMemRelease(CUmemGenericAllocationHandle h){return h==0x1234?0:CUDA_ERROR_INVALID_VALUE;}
CUresult cuLogicalEndpointBindMem(CUlogicalEndpointId id, CUdevice dev, cuuint64_t off, CUmemGenericAllocationHandle m, cuuint64_t mo, cuuint64_t sz, unsigned long long fl){return (m==0x1234&&sz==(2<<20))?0:CUDA_ERROR_INVALID_VALUE;}
CUresult cuLogicalEndpointUnbind(CUlogicalEndpointId id, CUdevice dev, cuuint64_t off, cuuint64_t sz){return 0;}
CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp*p, CUmemGenericAllocationHandle h){p->type=1;p->requestedHandleTypes=CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR|CU_MEM_HANDLE_TYPE_FABRIC;p->location.type=1;p->location.id=0;return 0;}
CUresult cuMemExportToShareableHandle(void*sh, CUmemGenericAllocationHandle h, CUmemAllocationHandleType t, unsigned long long f){if(h!=0x1234||f)return CUDA_ERROR_INVALID_VALUE;if(t==CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR){int fd=open("/dev/null",O_RDONLY|O_CLOEXEC);if(fd<0)return CUDA_ERROR_OPERATING_SYSTEM;*(int*)sh=fd;return 0;}if(t==CU_MEM_HANDLE_TYPE_FABRIC){memset(sh,0xcd,64);return 0;}return CUDA_ERROR_INVALID_VALUE;}
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle*h, void*os, CUmemAllocationHandleType t){if(t==CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR){if(fcntl((int)(uintptr_t)os,F_GETFD)<0)return CUDA_ERROR_INVALID_VALUE;*h=0x1234;return 0;}if(t==CU_MEM_HANDLE_TYPE_FABRIC){const unsigned char*b=os;if(b[0]!=0xcd||b[63]!=0xcd)return CUDA_ERROR_INVALID_VALUE;*h=0x1234;return 0;}return CUDA_ERROR_INVALID_VALUE;}
CUresult cuMemAddressReserve(CUdeviceptr*p, size_t s, size_t a, CUdeviceptr addr, unsigned long long f){*p=(CUdeviceptr)1<<40;return 0;}
CUresult cuMemAddressFree(CUdeviceptr p, size_t s){return p==((CUdeviceptr)1<<40)?0:CUDA_ERROR_INVALID_VALUE;}
CUresult cuMemMap(CUdeviceptr p, size_t s, size_t o, CUmemGenericAllocationHandle h, unsigned long long f){return (h==0x1234&&s<=(2<<20)&&!o&&!f)?0:CUDA_ERROR_INVALID_VALUE;}
CUresult cuMemUnmap(CUdeviceptr p, size_t s){return 0;}
